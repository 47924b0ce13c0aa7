"""Feeds: what the view's worker thread polls. Live and replay look the same to the app.

A :class:`Batch` is a list of messages to fold into ClusterState, with ``reset`` when the
state must be rebuilt first (a replay seek). No Textual here: ``zeroscope replay --headless``
uses the same feed. Seeking reads only the Hellos and a short window of steps before the
target through the trace's (step, rank, kind) index, never the whole file.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from zeroscope.agent.schema import Message
from zeroscope.state.viewmodel import ClusterState, StepSeries
from zeroscope.store.feed import feed_trace, preamble

SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0)
BASE_STEPS_PER_S = 4.0
"""Replay pace at speed 1x (steps per second)."""
OVERVIEW_REPORTS = 200_000
"""Traces up to this many step reports are read whole (in slices between replay polls) for the
history plots' whole-run series; larger ones plot the steps replayed so far."""
OVERVIEW_STEPS = 20_000
"""Steps of whole-run series kept (one StepPoint each, a few hundred bytes)."""
OVERVIEW_SLICE = 2048
"""Messages folded per poll while reading the overview (keeps seeks and steps responsive)."""


@dataclass(slots=True)
class Batch:
    messages: list[Message] = field(default_factory=list)
    reset: bool = False
    """Clear ClusterState before folding these in (a seek)."""
    final: bool = False
    """No more messages will come (end of the trace): close steps still open."""
    overview: StepSeries | None = None
    """The whole run's history series (replay), once read."""
    snapshot: bool = False
    """Holds a live source's catch-up snapshot (a late viewer's first state): folded, it is
    frozen out of the garbage collector's sight (store/gc_pause.py)."""


class Source(Protocol):
    def poll(self, timeout: float = 0.1) -> list[Message]: ...


class LiveFeed:
    """A live Source (collector listener or viewer subscription) as a feed.

    It keeps the messages taken from the source until the view has folded them
    (:meth:`applied`): the view can close between the two (``q``, "Leave running"), and
    ``zeroscope run`` then folds :meth:`unapplied` itself, which otherwise were lost to it (its
    headless lines went on with "no report of steps 22-23 reached zeroscope", though the trace
    held them)."""

    live = True

    def __init__(self, source: Source) -> None:
        self.source = source
        self._snapshots = 0
        self._in_flight: deque[Message] = deque()
        self._lock = threading.Lock()

    def poll(self, timeout: float) -> Batch | None:
        messages = self.source.poll(timeout)
        # A LiveSource counts the state snapshots it has taken (other sources have none).
        snapshots = getattr(self.source, "snapshots", 0)
        snapshot, self._snapshots = snapshots != self._snapshots, snapshots
        if not messages:
            return None
        with self._lock:
            self._in_flight.extend(messages)
        return Batch(messages, snapshot=snapshot)

    def applied(self, count: int) -> None:
        """The view folded the next ``count`` messages taken (UI thread; in the order taken)."""
        with self._lock:
            for _ in range(min(count, len(self._in_flight))):
                self._in_flight.popleft()

    def unapplied(self) -> list[Message]:
        """The messages taken from the source that the view never folded, in order."""
        with self._lock:
            out = list(self._in_flight)
            self._in_flight.clear()
        return out


class Trace(Protocol):
    """What the feed needs of zeroscope.store.trace.TraceReader."""

    def steps(self) -> tuple[int, int] | None: ...
    def hellos(self) -> list: ...
    def messages(self, from_step: int | None = None, to_step: int | None = None) -> object: ...


class ReplayFeed:
    """Plays a recorded trace step by step: pause, step, speed, go to step."""

    live = False

    def __init__(
        self,
        trace: Trace,
        *,
        start_step: int | None = None,
        paused: bool = False,
        speed: float = 1.0,
    ) -> None:
        self.trace = trace
        span = trace.steps()
        self.first, self.last = span if span else (0, -1)
        world = max(1, len(trace.hellos()))
        # The collector's records of senders it turned away name the ranks that never came;
        # they are replayed with the Hellos, in the order every reader of a trace uses.
        self.hellos: list[Message] = preamble(trace)  # type: ignore[arg-type]
        self.window = max(1, min(64, 4096 // world))
        """Steps of history rebuilt on a seek: enough for the charts, bounded to ~4,096 reports
        (one step from 4,096 ranks on: a step closes once every rank reported it, so the
        target is closed and judged by its own reports, and at 16,384 ranks each step more is
        ~80 ms of decoding before the view moves)."""
        self.paused = paused
        self.speed = speed if speed in SPEEDS else 1.0
        self.position = self.first - 1
        self._lock = threading.Lock()
        self._seek: int | None = self.first if start_step is None else self.clamp(start_step)
        self._due = 0.0
        self._ended = False
        count = getattr(trace, "count", None)
        small = count is None or count("step") <= OVERVIEW_REPORTS
        self._overview: Iterator[StepSeries | None] | None = (
            self._read_overview() if small else None
        )

    def _read_overview(self) -> Iterator[StepSeries | None]:
        """The whole trace through a ClusterState of its own, a slice per ``next``: yields None
        until done, then the run's StepSeries (the figures the live view computed step by step)."""
        state = ClusterState()
        state.series = StepSeries(OVERVIEW_STEPS)
        for i, _ in enumerate(feed_trace(self.trace, state)):  # type: ignore[arg-type]
            if i % OVERVIEW_SLICE == OVERVIEW_SLICE - 1:
                yield None
        yield state.series

    def _overview_slice(self) -> StepSeries | None:
        """Read the next slice of the overview; the series when complete. A trace that fails to
        read gives no overview (the replay itself reports the error)."""
        if self._overview is None:
            return None
        try:
            series = next(self._overview)
        except Exception:
            self._overview = None
            return None
        if series is not None:
            self._overview = None
        return series

    @property
    def reading_overview(self) -> bool:
        return self._overview is not None

    def clamp(self, step: int) -> int:
        return max(self.first, min(self.last, step))

    # -- commands (UI thread) ----------------------------------------------------------------
    def toggle_pause(self) -> bool:
        with self._lock:
            self.paused = not self.paused
            return self.paused

    def step_by(self, delta: int) -> None:
        with self._lock:
            self.paused = True
            base = self._seek if self._seek is not None else self.position
            self._seek = self.clamp(base + delta)

    def goto(self, step: int) -> int:
        with self._lock:
            self._seek = self.clamp(step)
            return self._seek

    def faster(self, steps: int = 1) -> float:
        with self._lock:
            i = SPEEDS.index(self.speed) + steps
            self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i))]
            return self.speed

    # -- the worker's side -------------------------------------------------------------------
    def poll(self, timeout: float) -> Batch | None:
        with self._lock:
            target, self._seek = self._seek, None
            paused, speed = self.paused, self.speed
        if target is not None:
            return self._seek_to(target)
        if self._overview is not None:
            series = self._overview_slice()
            if series is not None:
                return Batch(overview=series)
            if paused or self.position >= self.last:
                return None  # no waiting while there is reading to do
        if paused or self.position >= self.last:
            if self.position >= self.last and not self._ended and self.last >= self.first:
                self._ended = True
                return Batch(final=True)
            time.sleep(timeout)
            return None
        now = time.monotonic()
        if now < self._due:
            time.sleep(min(timeout, self._due - now))
            return None
        interval = 1.0 / (BASE_STEPS_PER_S * speed)
        count = max(1, int(timeout / interval))  # fast speeds deliver several steps per poll
        to = min(self.last, self.position + count)
        batch = Batch(list(self.trace.messages(self.position + 1, to)))  # type: ignore[call-overload]
        self.position = to
        self._due = now + interval * count
        return batch

    def _seek_to(self, step: int) -> Batch:
        start = max(self.first, step - self.window + 1)
        messages = [*self.hellos, *self.trace.messages(start, step)]  # type: ignore[misc]
        self.position = step
        self._ended = step >= self.last
        return Batch(messages, reset=True, final=self._ended)
