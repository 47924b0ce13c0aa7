"""Step reports and events on their way from the training thread to the collector.

Encoding a StepReport and handing it to ZeroMQ costs the training thread tens of microseconds
per step, more when the send wakes ZeroMQ's I/O thread on a loaded machine (issue 18). So the
training thread only appends a plain struct (a :class:`~.pending.PendingReport` or an
:class:`~.schema.Event`) to a ``collections.deque`` (an append is atomic under the GIL: no lock,
nothing to wait for), raises the ``wake`` flag (one attribute read when the sender is already
awake, a ``threading.Event.set`` otherwise: a few microseconds per step) and goes on. The
sender thread (the agent's sampler thread) wakes on that flag, or every ``DRAIN_INTERVAL_S``
for reports still waiting, takes them in order, finishes each report once what it waits for
has completed (agent/pending.py), encodes it and sends it without blocking. Waking on each
step end, not on a timer only, keeps a report's way out short: a rank killed by SIGKILL (the
OOM killer) loses at most the report being encoded, not the last 50 ms of steps, which are the
ones a user needs to see why it died.

Nothing handed over is lost silently: the queue holds at most ``MAX_QUEUED`` items; when the
sender falls that far behind (a stalled thread), the oldest item is dropped and counted, and the
count joins the publisher's drops, which ride on the next StepReport or Heartbeat that gets
through (``dropped``). With the collector gone the publisher drops and counts as before; nothing
here waits for it. ``drain(block=True)`` at close sends everything left.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from .pending import PendingReport
from .schema import Event

DRAIN_INTERVAL_S = 0.05
"""How often the sender thread looks again at reports still waiting for their collectives or
device events (a new report or event wakes it at once)."""

CLOSE_WAIT_S = 2.0
"""At close: how long to wait for a sender thread still sending before giving up."""

MAX_QUEUED = 256
"""Items handed over and not yet taken by the sender before the oldest is dropped (counted)."""


class Outbox:
    """The hand-off queue (training thread: ``put``) and its sender side (``drain``)."""

    def __init__(self, publisher: Any, current_step: Callable[[], int], rank: int = 0) -> None:
        self.publisher = publisher
        self._current_step = current_step
        self._rank = rank
        self._handed: deque[PendingReport | Event] = deque()
        self._waiting: deque[PendingReport] = deque()
        """Reports taken by the sender, waiting (in order) for what they need to complete."""
        self._lock = threading.Lock()
        """Serializes senders (the sampler thread, a test, close); never taken by ``put``."""
        self.lost = 0
        """Items dropped because the queue was full (written by the training thread only)."""
        self._lost_counted = 0
        self.errors = 0
        self.wake = threading.Event()
        """Raised by ``put``; the sender waits on it (agent/sampler.py)."""

    def put(self, item: PendingReport | Event) -> None:
        """Hand ``item`` over (training thread): never blocks, never raises."""
        handed = self._handed
        if len(handed) >= MAX_QUEUED:
            try:
                handed.popleft()
                self.lost += 1
            except IndexError:
                pass  # the sender emptied it meanwhile
        handed.append(item)
        wake = self.wake
        if not wake.is_set():  # set() takes a lock and may wake a thread: only when needed
            wake.set()

    def drain(self, block: bool = False) -> None:
        """Send, in order, every event and every report whose step has completed; ``block``
        (at close, the loop is over) sends everything, waiting for the device if needed."""
        # At close, a sender thread that did not stop (stuck in a send) must not hang the exit.
        if not self._lock.acquire(timeout=CLOSE_WAIT_S if block else -1):
            self.errors += 1
            return
        try:
            self._drain(block)
        finally:
            self._lock.release()

    def _drain(self, block: bool) -> None:
        handed, waiting, send = self._handed, self._waiting, self.publisher.send
        lost = self.lost - self._lost_counted
        if lost:
            self._lost_counted += lost
            self._count_dropped(lost)
        while handed:
            item = handed.popleft()
            if isinstance(item, PendingReport):
                waiting.append(item)
            else:
                send(item)  # an event does not wait behind reports
        step = self._current_step()
        while waiting:
            pending = waiting[0]
            pending.age = step - 1 - pending.report.step  # step ends since its own
            try:
                if not pending.finish(block):
                    return
            except Exception:  # an unreadable report is dropped (counted), never raised
                self.errors += 1
                waiting.popleft()
                self._count_dropped(1)
                continue
            waiting.popleft()
            self._send_report(pending)

    def _count_dropped(self, n: int) -> None:
        try:
            self.publisher.count_dropped(n)
        except Exception:
            self.errors += 1

    def _send_report(self, pending: PendingReport) -> None:
        report = pending.report
        if report.loss is not None and not math.isfinite(report.loss):
            self.publisher.send(
                Event(
                    rank=self._rank,
                    step=report.step,
                    wall_ns=report.wall_ns,
                    event="nan_loss",
                    message=f"loss is {report.loss} at step {report.step}",
                )
            )
        self.publisher.send(report)

    @property
    def queued(self) -> int:
        """Items handed over or waiting, not sent yet."""
        return len(self._handed) + len(self._waiting)
