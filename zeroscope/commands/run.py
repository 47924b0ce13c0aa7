"""``zeroscope run [torchrun flags] train.py [args]``: collector + torchrun + the live view.
With the ``deepspeed`` launcher's flags (``--num_gpus 2`` ...) DeepSpeed's launcher runs the job
instead (zeroscope.run.deepspeed_launcher).

The job's exit code is zeroscope's. Ctrl-C stops the job the way torchrun does (SIGINT to its
process group, then SIGTERM) and keeps the trace. Without a terminal, or with ``--headless``,
one line per step is printed instead of the TUI, then a summary naming the trace.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from zeroscope.run import console
from zeroscope.run.deepspeed_launcher import (
    add_deepspeed_arguments,
    deepspeed_argv,
    mixed_launcher_flags,
    uses_deepspeed_launcher,
)
from zeroscope.run.hangup import HangUp
from zeroscope.run.interrupts import Interrupts
from zeroscope.run.job_end import keep_in_trace
from zeroscope.run.launch import (
    Job,
    QueueSource,
    add_torchrun_arguments,
    job_environment,
    runs_a_file,
    torchrun_argv,
    with_bootstrap,
)
from zeroscope.state.viewmodel import ClusterState, receive_now, step_lines, summary_lines
from zeroscope.store.gc_pause import raise_viewer_thresholds

if TYPE_CHECKING:
    from zeroscope.remote.multinode import CollectorPlan

HELP = (
    "launch a training script under torchrun (or DeepSpeed's launcher, given its flags) with a "
    "collector and the live view"
)

DRAIN_S = 2.0
"""After the job exits, how long to wait for messages still in flight (Byes, last reports)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_torchrun_arguments(parser)
    add_deepspeed_arguments(parser)
    parser.add_argument("--headless", action="store_true", help="print one line per step")
    parser.add_argument("--record", metavar="PATH", help="trace file (default runs/JOB.zstrace)")
    parser.add_argument("--bind", default="127.0.0.1", help="collector address (default loopback)")
    parser.add_argument("--port", type=int, default=0, help="collector port (default: any free)")
    parser.add_argument(
        "--as-deepspeed",
        action="store_true",
        help="the job's `import deepspeed` gets the bundled engine (its DeepSpeed API)",
    )
    parser.add_argument(
        "--relay",
        action="store_true",
        help="on a node other than 0 (--nnodes): this node's ranks report through a node relay "
        "in this process, one connection to node 0's collector (zeroscope relay)",
    )
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")


LAUNCHERS = ("python", "python3", "torchrun", "deepspeed", "accelerate")
"""What a user types before the script by habit (``zeroscope run python train.py``)."""


def _launcher_hint(script: str) -> str:
    """How to say it instead, when ``script`` names an interpreter or launcher, not a script."""
    if Path(script).name not in LAUNCHERS:
        return ""
    return (
        f" ({script} is a program, not the script: zeroscope run launches the script as "
        "torchrun does, `zeroscope run train.py ARGS`; `--no-python PROGRAM` runs a program)"
    )


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError
    from zeroscope.collector.server import Collector

    script = Path(args.script)
    if runs_a_file(args) and not script.is_file():
        raise CliError(f"no such training script: {args.script}" + _launcher_hint(args.script))
    # Multi-node and discovery (ssh helper; zeroscope/remote/multinode.py, docs/remote.md):
    # node 0 hosts the job's one collector, other nodes' ranks report to it with the job token.
    from zeroscope.remote import discovery, multinode

    try:
        plan = multinode.plan_from_run_args(args)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    argv = _launcher_argv(args, str(script))
    base: dict[str, str] = dict(os.environ)
    if args.as_deepspeed:
        from zeroscope.run.as_deepspeed import alias_environment

        base = alias_environment(base)
    if not plan.hosts_collector:
        env = with_bootstrap({**base, **plan.rank_env()})
        if getattr(args, "relay", False):
            return _worker_through_relay(argv, env, plan)
        return multinode.run_worker_node(Job(argv, env), plan)
    job_id = plan.job_id
    trace = Path(args.record) if args.record else Path("runs") / f"{job_id}.zstrace"
    try:
        trace.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create the trace folder {trace.parent}: {exc.strerror}") from None
    if trace.exists():
        raise CliError(f"trace {trace} already exists; pick another --record path")
    discovery.create_private(trace)  # 0600 before SQLite opens it
    token = plan.token  # always: on a shared login node loopback is reachable by all users
    bind = args.bind if args.bind != "127.0.0.1" else plan.bind_host
    try:
        collector = Collector(
            bind, plan.port, record=trace, token=token.encode(), job_id=job_id
        ).start()
    except (ValueError, OSError) as exc:
        raise CliError(f"cannot start the collector on {bind}:{plan.port}: {exc}") from None
    source = QueueSource()
    collector.add_listener(source.put)
    ingest = multinode.local_ingest_address(collector.ingest_address)
    env = job_environment(base, ingest, job_id, token)
    handle = discovery.register(
        discovery.JobRecord.here(
            job_id=job_id,
            ingest_address=collector.ingest_address,
            viewer_address=collector.viewer_address,
            pub_address=collector.pub_address,
            token=token,
            trace=trace,
            kind="run",
            command=argv,
            nnodes=multinode.nnodes_of(args),
        )
    )
    # This process hosts the collector and the view; the ranks are the job's own interpreters,
    # whose collector is the user's (they start at Python's defaults).
    raise_viewer_thresholds()  # rarer collections (store/gc_pause.py)
    state = ClusterState()
    state.job_id = job_id  # known before any rank reports (and if none ever does)
    collector.on_recording_stopped = lambda reason: setattr(state, "recording_error", reason)
    state.recording_error = collector.recording_error  # in case it stopped already
    job: Job | None = None

    def stop_everything() -> None:
        if job is not None and job.returncode is None:
            job.stop(grace_s=5.0, reason="the terminal closed")
        collector.stop()

    HangUp(stop_everything).install()  # a closed terminal: unwind, and stop the job below
    log = str(trace.with_suffix(".log"))  # all of the job's output, whatever the terminal shows
    interrupts = Interrupts().install()  # before the job starts: any Ctrl-C is a stop
    try:
        if args.headless or not sys.stdout.isatty():
            job = Job(argv, env, log)
            job.spawned_ranks = lambda: spawned_ranks(state)
            interrupts.attach(job)
            return run_headless(job, source, state, str(trace))
        # The TUI owns the terminal: the job's own output goes only to the log.
        job = Job(argv, env, log, forward=False, terminal=True)
        job.spawned_ranks = lambda: spawned_ranks(state)
        interrupts.attach(job)
        return run_live(job, source, state, str(trace))
    finally:
        if job is not None and job.returncode is None:
            job.stop(reason="zeroscope is exiting")  # on an error or hang-up: never orphan it
        interrupts.restore()
        collector.stop()
        if job is not None and job.ended is not None:  # summary and replay say it as it was
            keep_in_trace(trace, job.ended)
        discovery.unregister(handle)


def _worker_through_relay(argv: list[str], env: dict[str, str], plan: CollectorPlan) -> int:
    """A worker node whose ranks report to a relay started here (zeroscope/collector/relay.py),
    which forwards to node 0's collector; it stops when the job ends."""
    from zeroscope.cli import CliError
    from zeroscope.collector.relay import Relay
    from zeroscope.remote import multinode

    relay = Relay(plan.connect_address or "", token=plan.token.encode(), node_rank=plan.node_rank)
    try:
        relay.start()
    except OSError as exc:
        raise CliError(f"cannot start the node relay: {exc}") from None
    print(
        f"zeroscope: node {plan.node_rank}'s ranks report through the node relay at "
        f"{relay.address}",
        file=sys.stderr,
        flush=True,
    )
    try:
        return multinode.run_worker_node(
            Job(argv, {**env, multinode.COLLECTOR_ENV: relay.address}), plan
        )
    finally:
        time.sleep(DRAIN_S)  # the ranks' last reports and Byes still in the relay
        relay.stop()


def _launcher_argv(args: argparse.Namespace, script: str) -> list[str]:
    """torchrun's command, or DeepSpeed's launcher's when a flag only it has was given."""
    from zeroscope.cli import CliError

    if not uses_deepspeed_launcher(args):
        return torchrun_argv(args, script, args.script_args)
    mixed = mixed_launcher_flags(args)
    if mixed:
        raise CliError(
            f"{mixed} is torchrun's and the other launcher flags are DeepSpeed's launcher's: "
            "use one launcher's flags"
        )
    # With --as-deepspeed the launcher's own processes keep the real DeepSpeed (the alias's
    # start-up hook knows them, engine/deepspeed/boot); the ranks they start get the alias.
    return deepspeed_argv(args, script, args.script_args)


def spawned_ranks(state: ClusterState) -> bool:
    """Whether the job's ranks were spawned by the job itself (docs/engines/torchrun.md)."""
    return any(rs.hello is not None and rs.hello.spawned for rs in state.ranks.values())


def run_headless(job: Job, source: QueueSource, state: ClusterState, trace: str) -> int:
    """One line per completed step while the job runs, then the summary. (Ctrl-C and SIGTERM
    stop the job: zeroscope.run.job.Interrupts, installed by main.)"""
    while job.returncode is None:
        _print_steps(state, source.poll(0.2))
        console.flush_due()  # lines that waited for a job's unfinished line
    _drain(state, source)
    before = state.last_complete
    for line in step_lines(state, state.flush(), before):
        say(line)
    return _finish(job, state, trace)


def _finish(job: Job, state: ClusterState, trace: str) -> int:
    """The summary, how the job ended (once, in plain words), and its exit code."""
    # (Ranks the job spawned itself are numbered by their process group, not the launcher:
    # ``job.spawned_ranks`` has their failure said as the job's, naming none of these.)
    said = {r: rs.bye.message for r, rs in state.ranks.items() if rs.bye and rs.bye.exit_code}
    end = job.end(said)  # the job's output has ended: no line of it is left to finish
    console.flush_due(force=True)
    # A rank that failed with its own error before reporting explains the silence itself.
    explained = end.rank is not None and not (end.error or "").startswith("exited with code")
    silent = [] if explained else silent_job_notice(state)
    for line in [*summary_lines(state, trace), *silent]:
        say(line, wait=False)
    # A failure is a diagnostic: on stderr, where plain torchrun puts it (and ``2>err.txt``
    # catches it); a stop on request is not one.
    failed = end.code != 0 and not end.stopped
    for line in end.sentences(job.log):
        say(line, wait=False, stream=sys.stderr if failed else sys.stdout)
    say(f"job exit code {end.code}", wait=False)
    return end.code


def say(line: str, *, wait: bool = True, stream: TextIO | None = None) -> None:
    """print, on a line of its own (zeroscope.run.console), to a stdout (or ``stream``) that
    may have gone away (``| head``): the job is not stopped for that, only the printing."""
    try:
        console.own_line(stream or sys.stdout, line, wait=wait)
    except BrokenPipeError:
        from zeroscope.cli import quiet_stdout

        quiet_stdout()


def silent_job_notice(state: ClusterState) -> list[str]:
    """One line when no rank ever reported. An attached rank says its first word at its
    first optimizer step, so a script that ended before one (an argument error, a
    ``sys.exit`` on a check) reports nothing either: that comes first, before the bootstrap
    not loaded (which a new user was otherwise sent to look for)."""
    if state.ranks:
        return []
    return [
        "zeroscope: no rank reported: none reached the end of an optimizer step (a rank "
        "reports from there), or the workers did not load zeroscope's sitecustomize (python "
        "-S, or a launcher that resets PYTHONPATH?), or found no engine to attach to"
    ]


def _print_steps(state: ClusterState, messages: list) -> None:
    now = receive_now()
    for m in messages:
        before = state.last_complete
        for line in step_lines(state, state.ingest(m, now), before):
            say(line)


def _drain(state: ClusterState, source: QueueSource, *, lines: bool = True) -> None:
    """Take the messages still in flight: stop once every rank said Bye, or after a quiet
    moment, or at DRAIN_S at the latest. ``lines=False`` (after the live view): fold them in
    for the summary without a step line each, which after the view closed were stale lines
    (12-16 of them on a stop, some for half-reported steps) under a view that had shown more."""
    fold = _print_steps if lines else _fold_steps
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        # A rank's Bye is the last it sends: once every rank said it, what is left is already
        # queued, and the drain ends as soon as the queue is empty (waiting for a quiet 0.3 s
        # held every clean run's end that long for nothing).
        said_bye = bool(state.ranks) and all(r.bye for r in state.ranks.values())
        messages = source.poll(0.05 if said_bye else 0.3)
        fold(state, messages)
        if not messages:
            return


def _fold_steps(state: ClusterState, messages: list) -> None:
    now = receive_now()
    for m in messages:
        state.ingest(m, now)


def run_live(job: Job, source: QueueSource, state: ClusterState, trace: str) -> int:
    """The TUI; quitting asks whether to stop the job or leave it running headless."""
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.feed import LiveFeed

    feed = LiveFeed(source)
    app = ZeroscopeApp(state, feed, job=job, trace=trace)
    choice = app.run()
    left = feed.unapplied()  # taken from the source as the view closed, never folded
    if job.returncode is None and choice == "detach":
        print(f"zeroscope: the job keeps running; recording to {trace}", flush=True)
        _print_steps(state, left)
        return run_headless(job, source, state, trace)
    _fold_steps(state, left)
    if job.returncode is None:
        print("zeroscope: stopping the job", file=sys.stderr, flush=True)
        job.stop(reason="stopped from the view")
    _drain(state, source, lines=False)
    state.flush()
    return _finish(job, state, trace)
