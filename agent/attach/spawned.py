"""Ranks a job starts itself: ``torch.multiprocessing.spawn`` (PyTorch's DDP tutorial) or
``multiprocessing.Process`` (its "Writing Distributed Applications" tutorial) under ``zeroscope
run``.

Such a script is run as ``python train.py``: its process spawns the ranks, each calling
``init_process_group(rank=r, world_size=n)`` with its own ``MASTER_PORT``. Under torchrun (and
so under ``zeroscope run``, one worker) the spawned ranks inherit the worker's
``TORCHELASTIC_USE_AGENT_STORE=True``, which tells their rendezvous that torchrun's agent
already hosts the store: every rank, rank 0 included, waits as a client on a port nobody
serves, and the job hangs for the store's 30-minute timeout (plain torchrun does the same).
And each inherits the worker's ``RANK=0`` / ``WORLD_SIZE=1``, which is who the agent said it
was: every spawned rank reported as rank 0 of 1.

So a process's start is wrapped: the processes the job starts get the environment ``python
train.py`` would have given them (no agent store), and a mark saying that, if they join a
process group, their identity is its (agent/startup.py reads the rank and world size from
``torch.distributed`` there). The job's own process keeps its environment: both are put back
when the call returns. A child that joins no group (a DataLoader worker) has no use for either.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Any

from zeroscope.agent.startup import SPAWNED_ENV

from . import patches
from .install import launcher_process

AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""torchrun's word to its own workers that the rendezvous store is its agent's (torch's
``_torchelastic_use_agent_store``): wrong for ranks a worker starts with its own rendezvous."""


def install() -> None:
    """Wrap ``multiprocessing``'s ``Process.start``: every way a job starts its ranks itself
    reaches it (``torch.multiprocessing.spawn`` / ``start_processes``, ``mp.Process`` as
    PyTorch's "Writing Distributed Applications" tutorial does, a ``multiprocessing`` context's
    ``Process``), whatever the start method."""
    from multiprocessing.process import BaseProcess

    patches.replace(BaseProcess, "start", _starting_ranks(BaseProcess.start))


class _ChildEnvironment:
    """The environment changed while any process is being started, put back when the last
    start returns: two threads starting processes at once (a DataLoader's workers beside a
    pool) must not put back each other's change, which would leave the job's own process with
    the children's environment."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starting = 0
        self._saved: dict[str, str | None] = {}

    def enter(self) -> None:
        with self._lock:
            if not self._starting:
                env = os.environ
                self._saved = {name: env.get(name) for name in (AGENT_STORE_ENV, SPAWNED_ENV)}
                env.pop(AGENT_STORE_ENV, None)
                env[SPAWNED_ENV] = str(os.getpid())
            self._starting += 1

    def leave(self) -> None:
        with self._lock:
            self._starting -= 1
            if not self._starting:
                for name, value in self._saved.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


_CHILDREN = _ChildEnvironment()


def _starting_ranks(start: Any) -> Any:
    @functools.wraps(start)
    def start_process(*args: Any, **kwargs: Any) -> Any:
        if launcher_process():  # a launcher's own workers (function entrypoints) are its ranks
            return start(*args, **kwargs)
        _CHILDREN.enter()
        try:
            return start(*args, **kwargs)
        finally:
            _CHILDREN.leave()

    return start_process
