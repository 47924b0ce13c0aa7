"""A Bye when the rank is terminated (SIGTERM), and the process still dies of SIGTERM.

When one rank fails, torchrun (and Slurm, Kubernetes...) SIGTERMs the others within 0.1 s. A
survivor is usually hung in a collective at that moment (NCCL waits in C++; gloo too), so a
Python signal handler would only run when the collective returns, which it never does: without
help the survivors die as silently as the rank that failed, and the viewer cannot tell the
culprit ("died without a word") from the ranks the launcher stopped.

So, only where SIGTERM still has its default action (the user's own handler or SIG_IGN is left
alone), this installs a Python handler plus a wakeup fd read by a small thread of ours. The C
level writes the signal number to the fd at once, whatever the main thread is doing; the
thread sends the Bye ("SIGTERM", exit code 143 as a shell reports it), puts back the default
action and re-raises SIGTERM: the process dies of SIGTERM exactly as before, a Bye later.
The Python handler does the same should the fd not be ours any more (asyncio took it).

A forked child (a DataLoader worker) is born with the default action (it would share the fd,
and its own SIGTERM must not be read as its parent's), and leaves the fd at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

STOP_MESSAGE = "SIGTERM: stopped from outside (a launcher ending the job, a scheduler)"
STOP_CODE = 128 + signal.SIGTERM
BYE_DEADLINE_S = 2.0
"""The most a SIGTERM's death is put off for the Bye (torchrun waits 30 s before SIGKILL)."""


class TerminationBye:
    """Send a Bye on SIGTERM, then die of SIGTERM. ``say_bye(code, message)`` must not
    raise; it is called at most once. ``saying()`` tells whether the current thread is saying
    a Bye already (the rank's error or exit hooks): a SIGTERM that interrupts it lets it
    finish, and ``say_bye`` then waits for that Bye to leave before the process dies."""

    def __init__(
        self, say_bye: Callable[[int, str], None], saying: Callable[[], bool] | None = None
    ) -> None:
        self._say_bye = say_bye
        self._saying = saying
        self._after_bye = False
        """A SIGTERM landed in this process's own Bye: :meth:`bye_left` ends the process."""
        self._once = threading.Lock()
        self._read_fd = -1
        self.installed = False

    def install(self) -> bool:
        """Take over SIGTERM if it has its default action; False (nothing changed) if not, or
        off the main thread, or if someone else owns the wakeup fd."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            if signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False) != -1:
                signal.set_wakeup_fd(-1)  # pragma: no cover - somebody else's; give it back
                raise OSError("wakeup fd in use")
            signal.signal(signal.SIGTERM, self._on_signal)
        except (OSError, ValueError):
            os.close(read_fd)
            os.close(write_fd)
            return False
        self._read_fd = read_fd
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork_in_parent,
            after_in_child=self._forked,
        )
        threading.Thread(target=self._watch, name="zeroscope-sigterm", daemon=True).start()
        self.installed = True
        return True

    def _watch(self) -> None:
        """Block on the wakeup fd (no CPU until a signal): any handled signal writes its
        number there; only a SIGTERM still ours is acted on."""
        while True:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) == self._on_signal:
                self._terminate()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The main thread's path: normally the watcher has it already (the fd is written
        before this runs); act only if it did not come (the fd is not ours any more).

        When the signal lands in this thread's own Bye (torchrun's SIGTERM reaching a rank whose
        error is being reported: a peer's death raised in it first), holding it here would hold
        that Bye too, and the process would die without it at the deadline. So the Bye goes on,
        and the thread saying it ends the process as it left (:meth:`bye_left`), before the
        rank's exit could go on to exit with its own code (the watcher's ``say_bye`` waits for
        that Bye too); the deadline still holds."""
        if self._saying is not None and self._saying():
            self._after_bye = True
            deadline = threading.Timer(BYE_DEADLINE_S, _default_and_reraise)
            deadline.daemon = True
            deadline.start()
            return
        self._terminate(wait_s=0.5)
        time.sleep(BYE_DEADLINE_S + 1)  # the watcher is ending the process
        _default_and_reraise()

    def _terminate(self, wait_s: float = 0.0) -> None:
        if not self._once.acquire(timeout=wait_s):
            return  # the other path is at it; it ends the process
        # Whatever the Bye meets (a lock held by the interrupted main thread, a dead
        # collector), the process dies of SIGTERM within BYE_DEADLINE_S.
        deadline = threading.Timer(BYE_DEADLINE_S, _default_and_reraise)
        deadline.daemon = True
        deadline.start()
        with contextlib.suppress(Exception):
            self._say_bye(STOP_CODE, STOP_MESSAGE)
        _default_and_reraise()

    def bye_left(self) -> None:
        """Called by the thread that said the Bye, once it left: a SIGTERM that came during it
        ends the process now, of SIGTERM, as it would have without zeroscope."""
        if self._after_bye:
            _default_and_reraise()

    def _before_fork(self) -> None:
        """The child must be born with SIGTERM's default action: a parent that terminates a
        worker it just forked can beat the child's own at-fork reset, and the child's signal
        would reach our fd. (A SIGTERM to the parent in this instant ends it without a Bye.)"""
        if self.installed and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(Exception):
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def _after_fork_in_parent(self) -> None:
        if self.installed and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(Exception):
                signal.signal(signal.SIGTERM, self._on_signal)

    def _forked(self) -> None:
        self.installed = False
        with contextlib.suppress(Exception):
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(self._read_fd)


def _default_and_reraise() -> None:
    """Die of SIGTERM from any thread: signal.signal is main-thread-only, libc's is not."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal(int(signal.SIGTERM), None)  # None = SIG_DFL (0)
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        os._exit(STOP_CODE)  # only if SIGTERM somehow did not end the process
