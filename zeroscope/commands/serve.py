"""``zeroscope serve``: a headless collector and recorder for a job started elsewhere (by a
scheduler, by hand, or on another node).

    zeroscope serve -- torchrun --nproc-per-node 8 train.py     # wraps: the job's exit code
    zeroscope serve                                               # prints the export line

Without a command it collects until every rank of the job has said Bye (then the job is listed
as finished), or until Ctrl-C.

It binds 127.0.0.1 unless ``--bind`` says otherwise, always with a per-job token (on a shared
login node loopback is reachable by every local user), and leaves a discovery record so that
``zeroscope jobs`` here and ``zeroscope attach`` from a laptop can find it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeroscope.agent.attach import pythonpath_with_bootstrap
from zeroscope.agent.schema import Message
from zeroscope.cli import CliError
from zeroscope.commands.serve_steps import StepLines
from zeroscope.remote import discovery
from zeroscope.remote.job_over import ByeCounter
from zeroscope.remote.multinode import (
    COLLECTOR_ENV,
    JOB_ID_ENV,
    TOKEN_ENV,
    advertised_address,
    is_loopback,
    read_token_file,
)

HELP = "headless collector and recorder for a job started elsewhere"

ENDED_CLEAN_S = 1.0
"""Without a command, serve ends this long after the last rank's clean Bye (messages in flight)."""
ENDED_FAILED_S = 30.0
"""... or this long after the last Bye when some rank failed: room for torchrun's
``--max-restarts`` to bring the ranks back (they say Hello again)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bind",
        default="127.0.0.1",
        metavar="HOST",
        help="interface for the ingest port (default 127.0.0.1; anything else is reachable "
        "from the network and is guarded by the job token)",
    )
    parser.add_argument("--port", type=int, default=0, help="ingest port (default: any free)")
    parser.add_argument(
        "--advertise",
        metavar="HOST",
        help="host name other nodes use to reach this collector (default: this host's name)",
    )
    parser.add_argument(
        "--record", type=Path, metavar="TRACE", help="trace file (default runs/JOB.zstrace)"
    )
    parser.add_argument("--no-record", action="store_true", help="do not write a trace")
    parser.add_argument("--job-id", help="job id (default: $ZEROSCOPE_JOB_ID or a fresh one)")
    parser.add_argument(
        "--token-file",
        type=Path,
        metavar="PATH",
        help="read the job token from PATH (created 0600 if missing): share it with other nodes",
    )
    parser.add_argument(
        "--env-file",
        type=Path,
        metavar="PATH",
        help="also write the export line to PATH (0600) for job scripts to source",
    )
    parser.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="accept reports without the job token (refused unless bound to loopback)",
    )
    parser.add_argument(
        "--as-deepspeed",
        action="store_true",
        help="the job's `import deepspeed` gets the bundled engine (as `zeroscope run`'s flag)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no step lines on stderr while the job runs (the trace records every step)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- COMMAND ...: run it with the collector's environment; its exit code is ours",
    )


def _token(args: argparse.Namespace) -> str | None:
    if args.insecure_no_token:
        if not is_loopback(args.bind):
            raise CliError(
                f"refusing to listen on {args.bind} without authentication: anyone who can "
                "reach that port could feed the job's view; drop --insecure-no-token (a token "
                "is generated) or bind 127.0.0.1 and attach over SSH"
            )
        return None
    if args.token_file is not None:
        try:
            return read_token_file(args.token_file, create=True, wait_s=0)
        except (OSError, ValueError) as exc:
            raise CliError(f"cannot read token file {args.token_file}: {exc}") from None
    return os.environ.get(TOKEN_ENV) or discovery.new_token()


def job_environment(ingest: str, token: str | None, job_id: str) -> dict[str, str]:
    """What a rank needs in its environment to report to this collector."""
    env = {COLLECTOR_ENV: ingest, JOB_ID_ENV: job_id}
    env["PYTHONPATH"] = pythonpath_with_bootstrap(os.environ.get("PYTHONPATH"))
    if token:
        env[TOKEN_ENV] = token
    return env


def export_line(env: dict[str, str]) -> str:
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


def _start_collector(
    args: argparse.Namespace,
    token: str | None,
    trace: Path | None,
    job_id: str = "",
    listener: Any = None,
) -> Any:
    from zeroscope.collector.server import Collector  # imported here: zmq only when serving

    try:
        collector = Collector(
            bind_host=args.bind,
            port=args.port,
            record=trace,
            token=token.encode() if token else None,
            job_id=job_id,
        )
        collector.on_recording_stopped = lambda reason: print(
            f"zeroscope serve: {reason}", file=sys.stderr, flush=True
        )
        if listener is not None:
            collector.add_listener(listener)
        collector.start()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot listen on {args.bind}:{args.port}: {exc}") from None
    return collector


def _both(*listeners: Callable[[Message], None]) -> Callable[[Message], None]:
    def see(message: Message) -> None:
        for listener in listeners:
            listener(message)

    return see


def stats_line(collector: Any) -> str:
    """What came in and what was turned away (unauthenticated, oversized, malformed ...)."""
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(collector.rejected.items())) or "none"
    refused = ", ".join(f"{k} {v}" for k, v in sorted(collector.gate.refused.items()))
    return (
        f"received {collector.received}, accepted {collector.accepted}, "
        f"rejected: {rejected}; dropped by agents {collector.dropped_by_agents}"
        + (f"; refused connections: {refused}" if refused else "")
    )


def _create_private(trace: Path) -> None:
    try:
        discovery.create_private(trace)
    except FileExistsError:
        raise CliError(f"trace {trace} already exists; pick another --record path") from None
    except OSError as exc:
        raise CliError(f"cannot create the trace {trace}: {exc.strerror}") from None


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    job_id = args.job_id or os.environ.get(JOB_ID_ENV) or discovery.new_job_id()
    token = _token(args)
    ranks = ByeCounter()
    steps = StepLines(quiet=args.quiet)
    trace = None if args.no_record else (args.record or Path("runs") / f"{job_id}.zstrace")
    if trace is not None:
        _create_private(trace)
    try:
        collector = _start_collector(args, token, trace, job_id, _both(ranks.see, steps.see))
    except CliError:
        if trace is not None and trace.stat().st_size == 0:
            trace.unlink()
        raise
    _, port = discovery.split_address(collector.ingest_address)
    ingest = (
        collector.ingest_address
        if is_loopback(args.bind)
        else advertised_address(args.bind, port, args.advertise)
    )
    env = job_environment(ingest, token, job_id)
    if args.as_deepspeed:
        from zeroscope.run.as_deepspeed import alias_environment

        env = alias_environment(env)
    handle = discovery.register(
        discovery.JobRecord.here(
            job_id=job_id,
            ingest_address=collector.ingest_address,
            viewer_address=collector.viewer_address,
            pub_address=collector.pub_address,
            token=token or "",
            trace=trace,
            kind="serve",
            command=command,
        )
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        # Ctrl-C already reached the job (same process group); a scheduler's SIGTERM may not.
        if signum == signal.SIGTERM and child is not None and child.poll() is None:
            child.send_signal(signum)

    child: subprocess.Popen[bytes] | None = None
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.env_file:
            discovery.write_private(args.env_file, (export_line(env) + "\n").encode())
        where = f"viewer port {discovery.split_address(collector.viewer_address)[1]}"
        print(
            f"zeroscope serve: job {job_id}, ingest {collector.ingest_address}, {where}"
            + (f", trace {trace}" if trace else ""),
            file=sys.stderr,
            flush=True,
        )
        if not command:
            print(export_line(env), flush=True)
            print(
                "zeroscope serve: collecting until every rank has said Bye; Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            while not stop.is_set():
                steps.print_due(0.5)
                done, clean, quiet_s = ranks.over()
                if done and quiet_s >= (ENDED_CLEAN_S if clean else ENDED_FAILED_S):
                    how = "" if clean else ", some with an error"
                    print(
                        f"zeroscope serve: job {job_id} is over (every rank said Bye{how})",
                        file=sys.stderr,
                        flush=True,
                    )
                    break
            steps.finish()
            return 0
        try:
            child = subprocess.Popen(command, env={**os.environ, **env})
        except OSError as exc:
            raise CliError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from None
        while child.poll() is None:
            steps.print_due(0.2)
        code = child.wait()
        time.sleep(0.3)  # the ranks' last reports (Bye) may still be in flight
        steps.finish()
        return code if code >= 0 else 128 - code
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        collector.stop()
        discovery.unregister(handle)
        print(f"zeroscope serve: {stats_line(collector)}", file=sys.stderr, flush=True)
