"""The exit status a rank leaves with through ``sys.exit``, for its Bye.

A script that ends with ``sys.exit(main())``, stops on a bad loss with ``sys.exit(1)``, or runs
under a wrapper that catches the job's exception and exits (``torch.multiprocessing.spawn``'s
ranks: the traceback goes to the parent, the rank calls ``sys.exit(1)``) ends without an
uncaught exception: the excepthook never runs, and the Bye said at interpreter exit said exit
code 0 where torchrun then reported 3 (the run's summary said both). Python keeps no record of
the status for exit hooks, so ``sys.exit`` is wrapped: the wrapper notes the status, and the
exception being handled when it was called (the reason a wrapper exits), then calls the real
one. Only the main thread's call ends the process (elsewhere it ends a thread), and a
``SystemExit`` the job catches and goes on from is forgotten once another step ends.

The attach wraps it as the process starts (:data:`STATUS`), before the script runs, so a script
that took the name first (``from sys import exit``) is covered too; the agent, started later,
counts its steps for it.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, NoReturn


class ExitStatus:
    """What ``sys.exit`` was last asked on the main thread (:meth:`install`), for the Bye."""

    def __init__(self, steps: Any = None) -> None:
        self._steps = steps or (lambda: 0)
        """The agent's step count now (a step ended after the call: the job went on)."""
        self._noted: tuple[int, str, int] | None = None
        """(code, reason, step count) of the last call."""
        self._installed = False

    def count_steps(self, steps: Any) -> None:
        """The agent started: its step count from now (no step ended before it began)."""
        self._steps = steps
        if self._noted is not None:
            self._noted = (*self._noted[:2], steps())

    def install(self) -> None:
        """Wrap ``sys.exit`` (once)."""
        if self._installed:
            return
        self._installed = True
        real = sys.exit
        main = threading.main_thread()

        def exit(status: Any = None) -> NoReturn:
            if threading.current_thread() is main:
                try:
                    self._note(status)
                except Exception:
                    pass
            real(status)

        exit.__doc__ = real.__doc__
        sys.exit = exit

    def _note(self, status: object) -> None:
        if status is None:
            code, reason = 0, ""
        elif isinstance(status, int):
            code, reason = status & 0xFF, ""  # what the launcher sees (256 is 0)
        else:  # Python prints it and exits with 1
            code, reason = 1, str(status)
        handling = sys.exc_info()[1]
        if code and handling is not None and not isinstance(handling, SystemExit):
            reason = f"{type(handling).__name__}: {handling}"
        steps, noted = self._steps(), self._noted
        if not reason and noted is not None and noted[0] == code and noted[2] == steps:
            reason = noted[1]  # the same exit said again by an outer frame (multiprocessing's
            # spawned child exits with the status its process's run ended with)
        self._noted = (code, reason.splitlines()[0][:500] if reason else "", steps)

    def at_exit(self) -> tuple[int, str]:
        """(exit code, reason) for the Bye said at interpreter exit: the last ``sys.exit``'s,
        unless a step ended after it (0 and no reason)."""
        noted = self._noted
        if noted is None or noted[2] != self._steps():
            return 0, ""
        return noted[0], noted[1]


STATUS = ExitStatus()
"""The process's own (the attach installs it at start-up, the agent counts its steps)."""
