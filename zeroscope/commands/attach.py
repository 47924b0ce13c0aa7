"""``zeroscope attach [ssh://][user@]host[:port]``: the live view of a job on another machine.

Steps: ask the remote ``zeroscope jobs --json --all`` (through the system's ssh) which
collectors run there; pick one (``--job``, or the only one running); open ``ssh -N -L`` from a
free local port to its viewer port on the remote loopback; feed the view from the local end
(a snapshot, then live updates). When the tunnel drops it is rebuilt on the same local port,
and the view takes a fresh snapshot, so no step goes missing.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
from pathlib import PurePosixPath
from types import FrameType

from zeroscope.cli import CliError
from zeroscope.remote.discovery import JobRecord
from zeroscope.remote.ssh import SshClient, SshError, SshTarget
from zeroscope.store.gc_pause import raise_viewer_thresholds

HELP = "open the live view on a job on another machine, over SSH"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="[ssh://][user@]host[:port]")
    parser.add_argument("--job", metavar="ID", help="which job (default: the only one running)")
    parser.add_argument("-i", dest="identity", metavar="KEY", help="ssh identity file")
    parser.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="SSH_OPTION",
        help="passed to ssh as -o SSH_OPTION (repeatable)",
    )
    parser.add_argument(
        "--remote-zeroscope",
        default="zeroscope",
        metavar="PATH",
        help="the zeroscope command on the remote host (default: zeroscope on its PATH)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the jobs there (running and finished) and exit"
    )
    parser.add_argument(
        "--headless", action="store_true", help="print one line per step instead of the TUI"
    )
    parser.add_argument(
        "--reconnects",
        type=int,
        default=20,
        help="give up after this many consecutive failed tunnel rebuilds (default 20)",
    )


def replay_hint(client: SshClient, job: JobRecord) -> str:
    """``scp ... && zeroscope replay ...`` for a finished job's trace."""
    trace = job.trace or ""
    scp = ["scp"]
    if client.target.port:
        scp += ["-P", str(client.target.port)]
    if client.identity:
        scp += ["-i", client.identity]
    local = PurePosixPath(trace).name
    return (
        f"{shlex.join([*scp, f'{client.target.destination}:{trace}', '.'])} && "
        f"zeroscope replay {shlex.quote(local)}"
    )


def choose_job(jobs: list[JobRecord], wanted: str | None, client: SshClient) -> JobRecord:
    """The job to attach to, or CliError with what the user can do instead."""
    host = client.target.host
    running = [j for j in jobs if j.state == "running"]
    finished = [j for j in jobs if j.state == "finished"]
    if wanted is not None:
        match = [j for j in jobs if j.job_id == wanted]
        if not match:
            known = ", ".join(j.job_id for j in jobs) or "none"
            raise CliError(f"no job {wanted} on {host} (jobs there: {known})")
        job = match[0]
        if job.state == "finished":
            raise CliError(
                f"job {job.job_id} on {host} already finished; replay its trace: {replay_hint(client, job)}"
            )
        return job
    if len(running) == 1:
        return running[0]
    if len(running) > 1:
        ids = ", ".join(j.job_id for j in running)
        raise CliError(f"{len(running)} jobs run on {host} ({ids}); pick one with --job ID")
    if finished:
        last = finished[0]
        raise CliError(
            f"no running job: job {last.job_id} on {host} already finished; replay its trace: "
            f"{replay_hint(client, last)}"
        )
    raise CliError(f"no zeroscope jobs on {host} (start one with zeroscope serve or zeroscope run)")


def _status(line: str) -> None:
    print(f"zeroscope attach: {line}", file=sys.stderr, flush=True)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(args: argparse.Namespace) -> int:
    """SIGTERM / SIGHUP end attach as an exit does (128 + signal), so its ssh tunnel is closed
    on the way out: by default they would kill Python and leave ``ssh -N`` running."""
    raise_viewer_thresholds()  # a viewer process: rarer collections (store/gc_pause.py)
    previous = {sig: signal.signal(sig, _exit_on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _attach(args)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _attach(args: argparse.Namespace) -> int:
    try:
        target = SshTarget.parse(args.target)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    client = SshClient(target=target, identity=args.identity, options=list(args.options))
    try:
        jobs = client.remote_jobs(args.remote_zeroscope)
        if args.list:
            from zeroscope.commands.jobs import table

            print("\n".join(table(jobs)) if jobs else f"no zeroscope jobs on {target.host}")
            return 0
        job = choose_job(jobs, args.job, client)
        ports = [job.viewer_port] + ([job.pub_port] if job.pub_port else [])
        tunnel = client.tunnel(*ports)
    except SshError as exc:
        raise CliError(str(exc)) from None
    try:
        try:
            tunnel.open()
        except SshError as exc:
            raise CliError(str(exc)) from None
        _status(
            f"job {job.job_id} on {target.host}: tunnel "
            f"{tunnel.local_address(job.viewer_port)} (ssh pid {tunnel.pid})"
        )
        from zeroscope.remote.ssh_watch import watch_job

        return watch_job(
            client=client,
            job=job,
            tunnel=tunnel,
            remote_zeroscope=args.remote_zeroscope,
            headless=args.headless,
            max_reconnects=args.reconnects,
            status=_status,
        )
    except SshError as exc:
        raise CliError(str(exc)) from None
    finally:
        tunnel.close()
