"""``zeroscope jobs``: the collectors running on this machine (from their discovery records).

``--json`` is the machine interface ``zeroscope attach`` reads over SSH: one JSON array of
records (job id, ports, token, pid, trace, state). The token is printed only there; it is the
user's own secret, read from their own 0600 files, and SSH already authenticated them.
"""

from __future__ import annotations

import argparse
import sys
import time

import msgspec

from zeroscope.remote import discovery
from zeroscope.state import units

HELP = "list the collectors running on this machine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output (for attach)")
    parser.add_argument(
        "--all",
        action="store_true",
        help="also list finished jobs whose trace is still on disk",
    )


def _age(ns: int) -> str:
    return units.age(time.time() - ns / 1e9)


def main(args: argparse.Namespace) -> int:
    records = discovery.list_jobs(prune=True, include_finished=args.all)
    if args.json:
        sys.stdout.write(msgspec.json.encode(records).decode() + "\n")
        return 0
    if not records:
        print("no zeroscope jobs on this machine")
        return 0
    for line in table(records):
        print(line)
    return 0


def table(records: list[discovery.JobRecord]) -> list[str]:
    """The human listing (no tokens): one line per job under a header."""
    lines = [f"{'JOB':<24} {'STATE':<9} {'KIND':<6} {'PID':>7} {'AGE':>5} {'VIEWER':>6}  TRACE"]
    for r in records:
        lines.append(
            f"{r.job_id:<24} {r.state:<9} {r.kind:<6} {r.pid:>7} {_age(r.started_ns):>5} "
            f"{r.viewer_port:>6}  {r.trace or '-'}"
        )
    return lines
