"""A closed terminal ends zeroscope and its job, every time.

The hang-up unwinds the main thread (``SystemExit`` from the handler) so that the ordinary stop
runs: the job is stopped, the trace committed and closed. That is not enough on its own: an
exception raised by a signal handler is lost when the signal lands while the main thread runs a
finalizer or a callback from C (Python prints "Exception ignored" and carries on), and an
event-loop shutdown that waits on a task for ever never reaches the stop. Either way the live
view, with nobody left to answer it, would run for ever (a clean-clone run saw ``zeroscope run``
alive, parent 1, 90 s after its terminal closed, its job already gone). So the hang-up also arms
a backstop: if the process is still alive after a grace period, a daemon thread runs the stop
itself and ends the process with the hang-up's exit status.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

# Longer than the ordinary stop takes (Job.stop: torchrun's SIGINT, then SIGKILL after 10 s),
# so the backstop only acts when the ordinary path was lost or stuck.
GRACE_S = 30.0


class HangUp:
    """Installs the SIGHUP handler; ``stop`` is what the backstop runs (stop the job, close
    the trace) before it ends the process."""

    def __init__(self, stop: Callable[[], None], grace_s: float = GRACE_S) -> None:
        self._stop = stop
        self._grace_s = grace_s
        self.backstop: threading.Thread | None = None

    def install(self) -> HangUp:
        signal.signal(signal.SIGHUP, self._on_hang_up)
        return self

    def _on_hang_up(self, signum: int, frame: FrameType | None) -> None:
        # Once: the shell forwards its own SIGHUP to its jobs, and a second one raised inside
        # the stop cut it short (zeroscope died, the watchdog's SIGTERM met torchrun
        # mid-shutdown and it left its ranks alive).
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.backstop = threading.Thread(
            target=self._backstop, args=(128 + signum,), name="zeroscope-hangup", daemon=True
        )
        self.backstop.start()
        raise SystemExit(128 + signum)

    def _backstop(self, code: int) -> None:
        time.sleep(self._grace_s)
        with contextlib.suppress(BaseException):
            self._stop()
        os._exit(code)
