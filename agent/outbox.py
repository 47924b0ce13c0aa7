"""Step reports and events on their way from the training thread to the collector.

Encoding a StepReport and handing it to ZeroMQ costs the training thread tens of microseconds
per step, more when the send wakes ZeroMQ's I/O thread on a loaded machine (the agent's overhead budget, agent/cost.py). So the
training thread only appends a plain object (a :class:`~.pending.StepFacts` or an
:class:`~.schema.Event`) to a ``collections.deque`` (an append is atomic under the GIL: no lock,
nothing to wait for) and goes on. The sender thread (the agent's sampler thread) takes them in
order, makes each step's axis from its raw marks (agent/timeline.py), finishes each report once
what it waits for has completed (agent/pending.py), encodes it and sends what one wake-up found
as one ZeroMQ message, without blocking.

When the sender runs is a trade between the run's CPU and a report's way out. Waking a thread
is not free: on this project's 2-vCPU test VM each wake-up (the futex, the other vCPU's
interrupt, the GIL changing hands) costs ~50-250 us of CPU, more than all the agent's Python
work of a small step. So the training thread wakes the sender at most every
``WAKE_INTERVAL_S`` (or when ``WAKE_DEPTH`` items wait, for steps of a few ms or less): a step
of at least that length has its report sent as it ends (a rank
killed by SIGKILL, the OOM killer's way, loses at most the report in hand), and shorter steps
leave in batches, at most ``WAKE_INTERVAL_S`` plus one step after they end (a killed rank
then loses at most that much: the reports of its last ~0.5 s). Reports left when the loop
stops (an evaluation, a hang) go at the sender's next tick, within ``2 * DRAIN_INTERVAL_S``.

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
from time import perf_counter_ns
from typing import Any

from .loss_scale import LossScaleReading
from .pending import PendingReport, StepFacts
from .schema import Event, Heartbeat, Message
from .timeline import StepAxis, StepTimeline

DRAIN_INTERVAL_S = 0.5
"""How often the sender thread looks for reports on its own (those the training thread did not
wake it for, and those still waiting for their collectives or device events); twice that after
a step end woke it (agent/sampler.py: the next step end is due within ``WAKE_INTERVAL_S``, and
the two must not take turns waking it)."""

WAKE_INTERVAL_S = 0.5
"""The training thread wakes the sender at most this often (see the module docstring): 0.1 s
cost a 2-rank demo run ~0.5 % more CPU in wake-ups than 0.25 s (the agent's overhead budget, agent/cost.py), and 0.5 s is the
heartbeat's own interval (agent/sampler.py), so short steps add no wake-up of their own: each
wake-up carries a heartbeat and the reports since the last one, as a live view of a few hertz
wants them."""
_WAKE_INTERVAL_NS = int(WAKE_INTERVAL_S * 1e9)

CLOSE_WAIT_S = 2.0
"""At close: how long to wait for a sender thread still sending before giving up."""

MAX_QUEUED = 256
"""Items handed over and not yet taken by the sender before the oldest is dropped (counted)."""

WAKE_DEPTH = 64
"""The training thread also wakes the sender when this many items wait, however recent the last
wake-up: steps under ``WAKE_INTERVAL_S / MAX_QUEUED`` (2 ms: a small model on gloo, a quiet
machine) otherwise filled the queue between two timed wake-ups and its oldest reports were
dropped (steps 2-44 of a 300-step run never reached the view). 64 is one ZeroMQ message's worth
(agent/publish.py ``MAX_BATCH``), and leaves the sender ``MAX_QUEUED - WAKE_DEPTH`` steps to come
round; a wake-up per 64 steps costs each step under 4 us."""


def _urgent(item: StepFacts | Event) -> bool:
    """A step whose last record is a recorder mark that must be read before its ring turns
    over (agent/attach/flight_recorder.py): the sender wakes now, not at the next interval."""
    records: list[Any] = getattr(item, "records", None) or []
    return bool(records) and getattr(records[-1], "urgent", False) is True


class Outbox:
    """The hand-off queue (training thread: ``put``) and its sender side (``drain``)."""

    def __init__(
        self,
        publisher: Any,
        current_step: Callable[[], int],
        rank: int = 0,
        on_axis: Callable[[StepFacts, StepAxis], None] | None = None,
    ) -> None:
        self.publisher = publisher
        self._on_axis = on_axis
        """Told each step's facts and axis as the sender makes it, in step order."""
        self._current_step = current_step
        self._rank = rank
        self._handed: deque[StepFacts | Event | Heartbeat] = deque()
        self._waiting: deque[PendingReport] = deque()
        """Reports taken by the sender, waiting (in order) for what they need to complete."""
        self.timeline = StepTimeline()
        """The steps' axes, made by the sender in step order."""
        self._lock = threading.Lock()
        """Serializes senders (the sampler thread, a test, close); never taken by ``put``."""
        self.lost = 0
        """Items dropped because the queue was full (written by the training thread only)."""
        self._lost_counted = 0
        self.errors = 0
        self.wake = threading.Event()
        """Raised by ``put`` (at most every ``WAKE_INTERVAL_S``); the sender waits on it
        (agent/sampler.py)."""
        self._woken_ns = -_WAKE_INTERVAL_NS  # the first put wakes the sender

    def put(self, item: StepFacts | Event, now_ns: int | None = None) -> None:
        """Hand ``item`` over (training thread): never blocks, never raises. ``now_ns``
        (``time.perf_counter_ns``) when the caller has read the clock already."""
        self.add(item)
        now = perf_counter_ns() if now_ns is None else now_ns
        if (
            now - self._woken_ns >= _WAKE_INTERVAL_NS
            or len(self._handed) >= WAKE_DEPTH
            or _urgent(item)
        ):
            self._woken_ns = now
            self.wake.set()

    def add(self, item: StepFacts | Event | Heartbeat) -> None:
        """Queue ``item`` without waking the sender (``put`` wakes it; the sender thread adds
        its own heartbeat just before it drains, so it leaves in the same ZeroMQ message)."""
        handed = self._handed
        if len(handed) >= MAX_QUEUED:
            try:
                handed.popleft()
                self.lost += 1
            except IndexError:
                pass  # the sender emptied it meanwhile
        handed.append(item)

    def drain(self, block: bool = False, wait_s: float | None = None, read: bool = False) -> None:
        """Send, in order, every event and every report whose step has completed; ``block``
        (at close, the loop is over) sends everything, waiting for the device if needed.
        ``wait_s``: the most to wait for the sender thread's turn (default: forever, or
        CLOSE_WAIT_S with ``block``). ``read``: reports waiting for the Flight Recorder's next
        read have it now (a hurried close: ``PendingReport.finish``)."""
        # At close, a sender thread that did not stop (stuck in a send) must not hang the exit.
        if wait_s is None:
            wait_s = CLOSE_WAIT_S if block else -1
        if not self._lock.acquire(timeout=wait_s):
            self.errors += 1
            return
        try:
            batch: list[Message] = []
            beats: list[Message] = []
            try:
                self._drain(block, batch, beats, read)
                self._raised_meanwhile(batch)
            finally:
                # A heartbeat names the last step ended (up to which the reports are in this
                # batch): it goes after them, so that what arrived, or was recorded before a
                # full disk, never names a step whose report it lacks.
                batch += beats
                if batch:  # one ZeroMQ message (agent/publish.py ``send_batch``)
                    self.publisher.send_batch(batch)
        finally:
            self._lock.release()

    def _drain(
        self, block: bool, batch: list[Message], beats: list[Message], read: bool = False
    ) -> None:
        handed, waiting = self._handed, self._waiting
        lost = self.lost - self._lost_counted
        if lost:
            self._lost_counted += lost
            self._count_dropped(lost)
        while handed:
            item = handed.popleft()
            if not isinstance(item, StepFacts):
                # An event does not wait behind reports; a heartbeat goes last (``drain``).
                (beats if isinstance(item, Heartbeat) else batch).append(item)
                continue
            try:
                axis = self.timeline.axis(item.marks, item.end_ns, item.end_event)
            except Exception:  # unreadable marks: the report is dropped (counted), never raised
                self.errors += 1
                self._count_dropped(1)
                continue
            if self._on_axis is not None:
                try:
                    self._on_axis(item, axis)
                except Exception:
                    self.errors += 1
            waiting.append(PendingReport(item, axis))
        step = self._current_step()
        while waiting:
            pending = waiting[0]
            pending.age = step - 1 - pending.facts.step  # step ends since its own
            try:
                if not pending.finish(block, read):
                    return
            except Exception:  # an unreadable report is dropped (counted), never raised
                self.errors += 1
                waiting.popleft()
                self._count_dropped(1)
                continue
            waiting.popleft()
            self._send_report(pending, batch)

    def _raised_meanwhile(self, batch: list[Message]) -> None:
        """Events handed over while this drain finished reports go out with it: a part of the
        agent that turned itself off there (the Flight Recorder reader, whose first read may be
        the one at close) says so in this batch, not in a next drain that may never come. A
        report queued first keeps its place: what follows it waits for the next drain."""
        handed = self._handed
        while handed:
            item = handed.popleft()
            if not isinstance(item, Event):
                handed.appendleft(item)  # back in its place, ahead of what follows it
                return
            batch.append(item)

    def _count_dropped(self, n: int) -> None:
        try:
            self.publisher.count_dropped(n)
        except Exception:
            self.errors += 1

    def _send_report(self, pending: PendingReport, batch: list[Message]) -> None:
        report = pending.report
        self.errors += pending.facts.bad_transfers
        if report is None:
            return
        if report.loss is not None and not math.isfinite(report.loss):
            batch.append(
                Event(
                    rank=self._rank,
                    step=report.step,
                    wall_ns=report.wall_ns,
                    event="nan_loss",
                    message=f"loss is {report.loss} at step {report.step}",
                )
            )
        scale = pending.facts.figures[1]
        if isinstance(scale, LossScaleReading):  # a scaler's tensors, read on this thread
            batch += scale.events(self._rank, report.step, report.wall_ns)
        batch.append(report)

    @property
    def queued(self) -> int:
        """Items handed over or waiting, not sent yet."""
        return len(self._handed) + len(self._waiting)
