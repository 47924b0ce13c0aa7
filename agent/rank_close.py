"""How a rank ends: its Bye, after the reports it still holds, once, whichever thread or hook
asks first (the exit hooks, the excepthook, a SIGTERM: agent/startup.py, agent/termination.py).
A mixin of :class:`zeroscope.agent.live.LiveTelemetry`, which owns the attributes named below:
split from it for size, not reuse."""

from __future__ import annotations

import contextlib
import threading
import time

from .outbox import Outbox
from .publish import Publisher
from .sampler import Sampler
from .schema import Bye
from .termination import TerminationBye

RECONNECT_WAIT_S = 3.0
"""At the end of a run whose collector was lost mid-run (never one that was never reached, nor
one that refused us): how long the last reports wait for ZeroMQ to redial a collector that
came back (its reconnect backoff tops out at 1 s, agent/publish.py); a restarted collector
then records the run to its last step. Bounded, at exit only: the loop never waits for it."""

CLOSE_WAIT_S = 3.0
"""How long a second close (another thread's) waits for the first one's Bye to leave."""


class RankClose:
    """The Bye (see the module docstring)."""

    publisher: Publisher
    sampler: Sampler
    _outbox: Outbox
    rank: int
    step: int
    _base: int
    errors: int
    closed: bool
    _closing_thread: int | None
    _close_done: threading.Event
    termination: TerminationBye | None

    def saying_bye(self) -> bool:
        """Whether this thread is in :meth:`close`, before its Bye left (a SIGTERM handler
        that interrupted it lets it finish: agent/termination.py)."""
        return self._closing_thread == threading.get_ident() and not self._close_done.is_set()

    def close(self, exit_code: int = 0, message: str = "", *, hurry: bool = False) -> None:
        """The Bye, after the reports still held. ``hurry`` (the process is being terminated,
        maybe hung in a collective): what is ready goes, nothing waits for the device or for
        long on the sender thread."""
        if self.closed:
            # A close in progress on another thread (the rank's error or exit hooks, when
            # torchrun's SIGTERM comes): its Bye is on its way; the caller ends the process
            # only once it left (or its own deadline passed), or the Bye died with it.
            if self._closing_thread != threading.get_ident():
                self._close_done.wait(CLOSE_WAIT_S)
            return
        self.closed = True
        self._closing_thread = threading.get_ident()
        try:
            self.sampler.stop(0.2 if hurry else 2.0)
            pub = self.publisher
            pub.poll_connection()  # the sampler may not have seen the last events yet
            if not hurry and pub.reached and not pub.refused:
                # The collector went away mid-run (restarted, or its host rebooted): its
                # successor may be up already, ZeroMQ redialling on its backoff. The last
                # reports and the Bye go only over a live connection, so give it a moment
                # (at once when one is up: the socket is writable).
                pub.wait_live(RECONNECT_WAIT_S)
            with contextlib.suppress(Exception):
                if hurry:
                    # The recorder's read is a host one, a few ms: the last steps' reports
                    # waited for it (a rank ending by os._exit, a forked one's only way out).
                    self._outbox.drain(block=False, wait_s=0.2, read=True)
                else:
                    self._outbox.drain(block=True)
            self.publisher.poll_connection()
            self.publisher.send(
                Bye(
                    rank=self.rank,
                    step=self.step - 1 + self._base,
                    wall_ns=time.time_ns(),
                    exit_code=exit_code,
                    message=message,
                )
            )
        except Exception:
            self.errors += 1
        finally:
            self.publisher.close()
            self._close_done.set()
            if self.termination is not None:
                self.termination.bye_left()  # a SIGTERM that came meanwhile ends the rank
