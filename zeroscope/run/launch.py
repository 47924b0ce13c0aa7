"""Launching a job under torchrun with the collector's address in its environment.

We do not re-implement a spawner: the job runs torchrun's own code (``torch.distributed.run``'s
parser and ``run()``, inside :mod:`zeroscope.run.torchrun_main`) with the user's own torchrun flags,
so rendezvous, restarts and signal handling are torchrun's. :class:`~zeroscope.run.job.Job` starts
it in its own session, supervised (it dies with zeroscope), and reads its output.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping

from zeroscope.agent.attach import pythonpath_with_bootstrap
from zeroscope.agent.schema import Message
from zeroscope.run.job import Job as Job  # where run and the tests have always found it

COLLECTOR_ENV = "ZEROSCOPE_COLLECTOR"
JOB_ID_ENV = "ZEROSCOPE_JOB_ID"
TOKEN_ENV = "ZEROSCOPE_TOKEN"

TORCHRUN_OPTIONS: tuple[tuple[tuple[str, ...], bool], ...] = (
    # torch 2.13's torch.distributed.run parser: every option with all its spellings (the first
    # long one is sent); True when it takes a value. tests/test_run_flags.py checks this table
    # against the installed torch's own parser.
    (("--nnodes",), True),
    (("--nproc-per-node", "--nproc_per_node"), True),
    (("--rdzv-backend", "--rdzv_backend"), True),
    (("--rdzv-endpoint", "--rdzv_endpoint"), True),
    (("--rdzv-id", "--rdzv_id"), True),
    (("--rdzv-conf", "--rdzv_conf"), True),
    (("--standalone",), False),
    (("--max-restarts", "--max_restarts"), True),
    (("--monitor-interval", "--monitor_interval"), True),
    (("--start-method", "--start_method"), True),
    (("--event-log-handler", "--event_log_handler"), True),
    (("--role",), True),
    (("-m", "--module"), False),
    (("--no-python", "--no_python"), False),
    (("--run-path", "--run_path"), False),
    (("--log-dir", "--log_dir"), True),
    (("-r", "--redirects"), True),
    (("-t", "--tee"), True),
    (("--local-ranks-filter", "--local_ranks_filter"), True),
    (("--duplicate-stdout-filters", "--duplicate_stdout_filters"), True),
    (("--duplicate-stderr-filters", "--duplicate_stderr_filters"), True),
    (("--node-rank", "--node_rank"), True),
    (("--master-addr", "--master_addr"), True),
    (("--master-port", "--master_port"), True),
    (("--local-addr", "--local_addr"), True),
    (("--logs-specs", "--logs_specs"), True),
    (("--numa-binding", "--numa_binding"), True),
    (("--signals-to-handle", "--signals_to_handle"), True),
    (("--shutdown-timeout", "--shutdown_timeout"), True),
    (("--virtual-local-rank", "--virtual_local_rank"), False),
)
TORCHRUN_MODULE = "zeroscope.run.torchrun_main"
"""torchrun's own ``run()``, supervised: it dies with zeroscope and reports how the ranks ended."""


def _long(names: tuple[str, ...]) -> str:
    return next(n for n in names if n.startswith("--"))


def _dest(names: tuple[str, ...]) -> str:
    return _long(names)[2:].replace("-", "_")


def add_torchrun_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("torchrun (passed through to torch.distributed.run)")
    for names, takes_value in TORCHRUN_OPTIONS:
        # --help lists each flag once; the underscore spellings work without being listed.
        shown = tuple(n for n in names if "_" not in n)
        hidden = tuple(n for n in names if "_" in n)
        _add_option(group, shown, _dest(names), takes_value, None)
        if hidden:
            _add_option(group, hidden, _dest(names), takes_value, argparse.SUPPRESS)


def _add_option(
    group: argparse._ArgumentGroup,
    names: tuple[str, ...],
    dest: str,
    takes_value: bool,
    help_text: str | None,
) -> None:
    if takes_value:
        group.add_argument(*names, dest=dest, default=None, help=help_text)
    else:
        group.add_argument(*names, dest=dest, action="store_true", help=help_text)


def runs_a_file(args: argparse.Namespace) -> bool:
    """False when the script is a module name (``-m``) or a program (``--no-python``)."""
    return not (getattr(args, "module", False) or getattr(args, "no_python", False))


def torchrun_argv(args: argparse.Namespace, script: str, script_args: list[str]) -> list[str]:
    """``python -m zeroscope.run.torchrun_main [torchrun flags] script [args]`` for this
    interpreter; torchrun's own parser reads the flags."""
    argv = [sys.executable, "-m", TORCHRUN_MODULE]
    for names, takes_value in TORCHRUN_OPTIONS:
        value = getattr(args, _dest(names), None)
        if takes_value and value is not None:
            argv += [_long(names), str(value)]
        elif not takes_value and value:
            argv.append(_long(names))
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


class QueueSource:
    """A Source fed by the in-process collector's listener (thread-safe): the live view and the
    headless lines read the same stream the trace records.

    A deque under a Condition rather than ``queue.SimpleQueue``: CPython 3.11's
    ``SimpleQueue.get(timeout=...)`` recomputes its timeout after a signal handler ran and, when
    that lands past the deadline, waits for ever (a negative timeout means "block"), which a
    Ctrl-C near the end of a poll did to ``zeroscope run``. ``Condition.wait`` treats an expired
    deadline as expired.
    """

    MAX_BATCH = 100_000

    def __init__(self) -> None:
        self._items: deque[Message] = deque()
        self._ready = threading.Condition(threading.Lock())

    def put(self, message: Message) -> None:
        with self._ready:
            self._items.append(message)
            self._ready.notify()

    def poll(self, timeout: float = 0.1) -> list[Message]:
        """Whatever arrived (up to MAX_BATCH), waiting up to ``timeout`` for the first."""
        with self._ready:
            if not self._items:
                self._ready.wait(timeout)
            items = self._items
            count = min(len(items), self.MAX_BATCH)
            return [items.popleft() for _ in range(count)]

    def close(self) -> None:
        """Nothing to release (the collector owns the sockets)."""
