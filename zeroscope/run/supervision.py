"""The job dies with zeroscope, and the terminal is given back, even after ``kill -9``.

``zeroscope run`` starts torchrun in its own session (so the TUI's Ctrl-C never reaches it
unasked), which also means nothing stops the job when zeroscope is killed outright: torchrun and
its ranks would train on, orphaned, and the terminal would stay in the TUI's alternate screen
with echo off. A watchdog pipe closes both holes without signals or timing:

- zeroscope keeps the write end of a pipe and passes only the read end to the torchrun it
  starts (``pass_fds``; the write end is close-on-exec, so no other child holds it). The kernel
  closes the write end whenever zeroscope dies, however it dies, so the reader sees end-of-file
  at that moment (no race at start-up either: a pipe whose writer is already gone reads EOF);
- the reader, a thread in :mod:`zeroscope.run.torchrun_main`, then writes the escapes that leave the
  alternate screen, restores the terminal modes zeroscope had before its TUI started, and sends
  its own process SIGTERM, which torchrun handles by stopping its workers (SIGTERM, then SIGKILL
  after its shutdown timeout) before it exits.

Portable to any POSIX system (``PR_SET_PDEATHSIG`` is Linux-only and fires on the parent
*thread's* exit).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, MutableMapping
from typing import NoReturn

WATCH_FD_ENV = "ZEROSCOPE_WATCH_FD"
"""The read end of the watchdog pipe, in the supervised torchrun's environment."""
READY_FD_ENV = "ZEROSCOPE_READY_FD"
"""Where the supervised torchrun says it handles SIGINT/SIGTERM itself (one byte): a stop sent
before that would meet Python still starting up (a "Fatal Python error" on the terminal)."""
TTY_FD_ENV = "ZEROSCOPE_TTY_FD"
"""A descriptor of the terminal the TUI draws on (only while a TUI owns one)."""
TTY_MODES_ENV = "ZEROSCOPE_TTY_MODES"
"""The terminal's termios modes from before the TUI started, as JSON."""

LEAVE_TUI = (
    "\x1b[<u"  # pop the kitty keyboard mode Textual pushes
    "\x1b[?1000l\x1b[?1003l\x1b[?1015l\x1b[?1006l\x1b[?1016l"  # mouse reporting off
    "\x1b[?2004l"  # bracketed paste off
    "\x1b[?1004l"  # focus events off
    "\x1b[?2048l"  # in-band resize off
    "\x1b[?7h"  # line wrap back on
    "\x1b[?1049l"  # leave the alternate screen
    "\x1b[?25h"  # show the cursor
)
"""What Textual's linux driver undoes when it stops (textual/drivers/linux_driver.py)."""


def terminal_modes(fd: int) -> str | None:
    """The terminal's termios modes as JSON (None when ``fd`` is not a terminal)."""
    try:
        import termios

        iflag, oflag, cflag, lflag, ispeed, ospeed, cc = termios.tcgetattr(fd)
    except (ImportError, OSError):
        return None
    chars = [c.hex() if isinstance(c, bytes) else int(c) for c in cc]
    return json.dumps([iflag, oflag, cflag, lflag, ispeed, ospeed, chars])


def restore_terminal(fd: int, modes: str | None) -> None:
    """Leave the TUI's screen and put back ``modes`` (from :func:`terminal_modes`); best effort,
    silent: the terminal may be gone too."""
    with contextlib.suppress(OSError):
        os.write(fd, LEAVE_TUI.encode())
    if not modes:
        return
    with contextlib.suppress(ImportError, OSError, ValueError, TypeError):
        import termios

        *flags, chars = json.loads(modes)
        cc = [bytes.fromhex(c) if isinstance(c, str) else int(c) for c in chars]
        termios.tcsetattr(fd, termios.TCSANOW, [*flags, cc])


class Watchdog:
    """zeroscope's side: the pipe whose write end dies with this process, and the one on which
    the child says it is ready for signals."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()  # all close-on-exec (PEP 446)
        self._ready_r, self.ready_w = os.pipe()
        self._ready = False

    @property
    def child_fds(self) -> tuple[int, int]:
        """The descriptors the child must inherit (``pass_fds``)."""
        return self.read_fd, self.ready_w

    def child_env(self, tty_fd: int | None = None) -> dict[str, str]:
        """The environment entries that hand the pipes (and the terminal) to the child."""
        env = {WATCH_FD_ENV: str(self.read_fd), READY_FD_ENV: str(self.ready_w)}
        if tty_fd is not None:
            modes = terminal_modes(tty_fd)
            env[TTY_FD_ENV] = str(tty_fd)
            if modes:
                env[TTY_MODES_ENV] = modes
        return env

    def started(self) -> None:
        """The child holds its copies now: drop ours."""
        for fd in self.child_fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the child handles signals itself (or is gone: then waiting is over too);
        False when ``timeout`` passed first."""
        if not self._ready and select.select([self._ready_r], [], [], timeout)[0]:
            self._ready = True
        return self._ready

    def close(self) -> None:
        """Tell the child we are going (as our death would)."""
        for fd in (self.write_fd, self._ready_r):
            with contextlib.suppress(OSError):
                os.close(fd)


def announce_ready(environ: MutableMapping[str, str]) -> None:
    """The child's side: it handles SIGINT/SIGTERM now."""
    fd_text = environ.pop(READY_FD_ENV, None)
    if fd_text is not None:
        with contextlib.suppress(OSError):
            os.write(int(fd_text), b"1")
            os.close(int(fd_text))


def watch_parent(
    environ: MutableMapping[str, str], on_gone: Callable[[], None] | None = None
) -> bool:
    """The child's side: when the pipe named in ``environ`` reads EOF, restore the terminal,
    call ``on_gone`` (default: SIGTERM to this process). Removes the variables from
    ``environ`` so the workers do not inherit them. False when there is nothing to watch."""
    fd_text = environ.pop(WATCH_FD_ENV, None)
    tty_text = environ.pop(TTY_FD_ENV, None)
    modes = environ.pop(TTY_MODES_ENV, None)
    if fd_text is None:
        return False
    fd = int(fd_text)
    tty = int(tty_text) if tty_text else None

    def wait() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        if tty is not None:
            restore_terminal(tty, modes)
        if on_gone is not None:
            on_gone()
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=wait, name="zeroscope-watchdog", daemon=True).start()
    return True


def leave_on_stop(signum: int, save_outcome: Callable[[int], None]) -> NoReturn:
    """The child's side, for a stop that comes before its launcher started any process:
    ``save_outcome(signum)``, flush, and leave at once with 128 + the signal, as a shell reports
    a stop. Not an exception raised from the signal handler: it would land wherever the main
    thread is, most likely in an import of torch or DeepSpeed, and an ``except Exception`` there
    (they have many around optional imports) would swallow the stop: the launcher would go on
    to start the ranks as if no one had asked it to stop. Nothing needs unwinding yet."""
    with contextlib.suppress(Exception):
        save_outcome(signum)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(128 + signum)
