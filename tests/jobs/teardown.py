"""How the test jobs end their process group: past torch 2.13's gloo teardown abort.

A gloo worker thread can hold the last reference to a finished collective (its tensors) after
the main thread has returned from waiting on it; if the interpreter is already exiting when the
worker lets go, releasing the tensors' Python objects cannot take the GIL and the process
aborts ("terminate called without an active exception", SIGABRT, exit 134), after the job did
all its work (docs/testing.md has the backtrace). A plain barrier only narrows the window: the
barrier snapshots the collectives still in progress (weak references, whose memory goes with
the barrier), and whichever thread drops the barrier last frees them; once that was gloo's
worker during the exit (a core dump: ``~AsyncBarrierWork`` -> ``~AsyncAllreduceWork`` ->
``decref_pyobject`` -> ``take_gil`` -> ``std::terminate``).

So the barrier's Work is kept here for the rest of the process: the collectives the barrier
snapshotted are then freed only by the interpreter, on the main thread, and a collective the
barrier did not snapshot was already freed, under the group's lock, before the barrier could be
queued. The default group only: every test job's last collective is on it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

_HELD: list[Any] = []


def end_process_group() -> None:
    """Every rank past its last collective, then the group destroyed (see the module doc)."""
    work = dist.barrier(async_op=True)
    assert work is not None
    work.wait()
    _HELD.append(work)
    dist.destroy_process_group()
