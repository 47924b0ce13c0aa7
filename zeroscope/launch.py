"""Launching a job under torchrun with the collector's address in its environment.

We do not re-implement a spawner: the job runs as ``python -m torch.distributed.run ...`` with
the user's own torchrun flags, so rendezvous, restarts and signal handling are torchrun's. The
launcher gets its own process group (``start_new_session``), so a full-screen TUI owning the
terminal never hands the job a stray Ctrl-C, and stopping the job is one ``killpg``, as torchrun
itself forwards SIGINT/SIGTERM to its workers (torch/distributed/elastic/agent/server/api.py).
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from zeroscope.agent.attach import pythonpath_with_bootstrap
from zeroscope.agent.schema import Message

COLLECTOR_ENV = "ZEROSCOPE_COLLECTOR"
JOB_ID_ENV = "ZEROSCOPE_JOB_ID"
TOKEN_ENV = "ZEROSCOPE_TOKEN"

TORCHRUN_FLAGS: tuple[tuple[str, str], ...] = (
    # (our flag, torchrun's flag): dashes or underscores are accepted, torchrun's spelling sent.
    ("--nproc-per-node", "--nproc-per-node"),
    ("--nnodes", "--nnodes"),
    ("--node-rank", "--node-rank"),
    ("--master-addr", "--master-addr"),
    ("--master-port", "--master-port"),
    ("--rdzv-backend", "--rdzv-backend"),
    ("--rdzv-endpoint", "--rdzv-endpoint"),
    ("--rdzv-id", "--rdzv-id"),
    ("--rdzv-conf", "--rdzv-conf"),
    ("--max-restarts", "--max-restarts"),
    ("--local-addr", "--local-addr"),
)
TORCHRUN_SWITCHES = ("--standalone",)


def add_torchrun_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("torchrun (passed through to torch.distributed.run)")
    for ours, _ in TORCHRUN_FLAGS:
        # torchrun accepts both spellings (--nproc-per-node and --nproc_per_node); so do we.
        underscored = "--" + ours[2:].replace("-", "_")
        names = (ours,) if underscored == ours else (ours, underscored)
        group.add_argument(*names, default=None)
    for switch in TORCHRUN_SWITCHES:
        group.add_argument(switch, action="store_true")


def torchrun_argv(args: argparse.Namespace, script: str, script_args: list[str]) -> list[str]:
    """``python -m torch.distributed.run [flags] script [args]`` for this interpreter."""
    argv = [sys.executable, "-m", "torch.distributed.run"]
    for ours, theirs in TORCHRUN_FLAGS:
        value = getattr(args, ours[2:].replace("-", "_"), None)
        if value is not None:
            argv += [theirs, str(value)]
    for switch in TORCHRUN_SWITCHES:
        if getattr(args, switch[2:].replace("-", "_"), False):
            argv.append(switch)
    return [*argv, script, *script_args]


def job_environment(
    base: Mapping[str, str], collector: str, job_id: str, token: str | None = None
) -> dict[str, str]:
    env = with_bootstrap(base)
    env[COLLECTOR_ENV] = collector
    env[JOB_ID_ENV] = job_id
    if token:
        env[TOKEN_ENV] = token
    else:
        env.pop(TOKEN_ENV, None)
    return env


def with_bootstrap(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with zeroscope's bootstrap first on ``PYTHONPATH``: its ``sitecustomize`` attaches
    the agent to DeepSpeed, FSDP2, DDP and HF Trainer jobs with no change to the script
    (zeroscope.agent.attach). The job's own ``PYTHONPATH`` entries follow it."""
    env = dict(base)
    env["PYTHONPATH"] = pythonpath_with_bootstrap(env.get("PYTHONPATH"))
    return env


def new_job_id() -> str:
    """Sortable and unique enough on one machine: local time plus our pid."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


class Job:
    """The torchrun process (and, through its process group, its workers)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: str | None = None) -> None:
        """``log``: file for the job's stdout/stderr (the TUI owns the terminal); None lets
        them through (headless)."""
        self.argv = argv
        self.log = log
        out = open(log, "ab") if log else None  # noqa: SIM115 (handed to the child, closed below)
        try:
            self.process = subprocess.Popen(
                argv, env=env, start_new_session=True, stdout=out, stderr=out
            )
        finally:
            if out is not None:
                out.close()

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGINT first (torchrun forwards it and workers can clean up), then SIGTERM, then
        SIGKILL; returns the exit code."""
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.process.poll() is not None:
                break
            self.signal(sig)
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        return self.process.wait()

    def exit_code(self) -> int:
        """torchrun's exit code; a signal death maps to 128 + signal, as a shell reports it."""
        code = self.process.wait()
        return 128 - code if code < 0 else code


class QueueSource:
    """A Source fed by the in-process collector's listener (thread-safe queue): the live view
    and the headless lines read the same stream the trace records."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Message] = queue.SimpleQueue()

    def put(self, message: Message) -> None:
        self._queue.put(message)

    def poll(self, timeout: float = 0.1) -> list[Message]:
        """Whatever arrived, waiting up to ``timeout`` for the first message."""
        try:
            out = [self._queue.get(timeout=timeout)]
        except queue.Empty:
            return []
        while len(out) < 100_000:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return out

    def close(self) -> None:
        """Nothing to release (the collector owns the sockets)."""
