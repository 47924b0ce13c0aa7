"""Ctrl-C (or SIGTERM) to ``zeroscope run`` is a stop on request of its job.

Installed before the job starts, so a Ctrl-C at any moment counts, even one that lands while
torchrun is being started (it is passed on once the job exists). The handler only records and
signals (:meth:`zeroscope.run.job.Job.interrupt` is quick): slow work in a signal handler is what
made CPython 3.11's ``SimpleQueue.get(timeout)`` wait for ever (see launch.QueueSource).
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zeroscope.run.job import Job


class Interrupts:
    """Ctrl-C (or SIGTERM) to zeroscope is a stop on request of its job, from the moment the
    handlers are installed: one that comes while the job is being started is passed on once it
    exists. The first asks torchrun to stop, a second kills. Restores the previous handlers."""

    def __init__(self) -> None:
        self.job: Job | None = None
        self.count = 0
        self._early: tuple[str, int] | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def attach(self, job: Job) -> None:
        self.job = job
        if self._early is not None:
            job.interrupt(*self._early)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:  # os.write: print could re-enter a write the handler interrupted
            with contextlib.suppress(OSError):
                os.write(2, b"zeroscope: stopping the job (Ctrl-C again to kill it)\n")
        reason = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.job is None:
            self._early = (reason, 128 + signum)
        else:
            self.job.interrupt(reason, 128 + signum)
