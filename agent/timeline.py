"""A rank's step on one time axis: where the step starts and ends, and where each phase ran.

Every StepReport places its phases (``phase_spans``) and its collectives (``start_s``) on the
same axis: seconds since the step's start, the step starting where the previous one ended. On
CPU the axis is the host clock (``perf_counter_ns``), which is when the work ran. On CUDA the
host only enqueues work and runs ahead of the device, so host instants are enqueue times: the
axis is the device's, from CUDA events recorded on the current stream at each mark (step end,
phase entry and exit) and read with ``elapsed_time`` once ``query()`` says they completed — the
host never waits for the device. A report whose events have not completed yet waits for them
(agent/live.py keeps it queued).

``step_end`` may be called inside a phase (the bundled engine reports from within its
optimizer phase): the open phase is cut there, its time so far belongs to the step that ends,
and the rest of it (after the cut) to nothing — it is time between steps, counted in the next
step's duration and its implicit "data" phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .schema import Phases, PhaseSpan

PHASE_NAMES = ("data", "forward", "backward", "optimizer")


@dataclass(slots=True)
class Mark:
    """An instant on the axis: the host clock, and on CUDA an event recorded then."""

    host_ns: int
    event: Any = None


@dataclass(slots=True)
class StepAxis:
    """One finished step's marks: its start, its end and its phases' (name, start, end)."""

    start: Mark
    end: Mark
    spans: list[tuple[str, Mark, Mark]] = field(default_factory=list)

    def _events(self) -> list[Any]:
        marks = [self.start, self.end, *(m for _, a, b in self.spans for m in (a, b))]
        return [m.event for m in marks if m.event is not None]

    @property
    def device(self) -> bool:
        return self.start.event is not None and self.end.event is not None

    def ready(self, block: bool = False) -> bool:
        """Whether every device event completed (always on CPU). ``block`` waits (only at
        close, when the training loop is over)."""
        events = self._events()
        if block:
            for ev in events:
                ev.synchronize()
        return all(ev.query() for ev in events)

    def offset_s(self, mark: Mark, device: bool) -> float:
        """Seconds from the step's start to ``mark``."""
        if device and mark.event is not None:
            return float(self.start.event.elapsed_time(mark.event)) / 1e3
        return (mark.host_ns - self.start.host_ns) / 1e9

    def resolve(self, device: bool) -> tuple[float, Phases, list[PhaseSpan]]:
        """(duration, phase sums, phase spans) in seconds on the device axis when ``device``
        (events complete), else the host's."""
        spans = []
        sums: dict[str, float] = {}
        for name, a, b in self.spans:
            start = self.offset_s(a, device)
            duration = max(self.offset_s(b, device) - start, 0.0)
            spans.append(PhaseSpan(name=name, start_s=start, duration_s=duration))
            if name in PHASE_NAMES:
                sums[name] = sums.get(name, 0.0) + duration
        duration = max(self.offset_s(self.end, device), 0.0)
        return duration, Phases(**sums), spans


class StepTimeline:
    """Marks of the step in progress. ``cuda_event`` (None on CPU) records a timing event."""

    def __init__(self, cuda_event: Callable[[], Any] | None = None) -> None:
        self.cuda_event = cuda_event
        self.start: Mark | None = None
        self.previous_end: Mark | None = None
        """Where the previous step ended (this step's start once it began); None in step 1."""
        self._spans: list[tuple[str, Mark, Mark]] = []
        self._open: dict[int, tuple[str, Mark]] = {}
        self._next_token = 0
        self.data_seen = False
        self.forward_seen = False

    def mark(self, host_ns: int | None = None) -> Mark:
        event = self.cuda_event() if self.cuda_event is not None else None
        return Mark(time.perf_counter_ns() if host_ns is None else host_ns, event)

    def begin(self, host_ns: int | None = None) -> Mark:
        """The step's start (the first thing that happens in step 1; the previous end after)."""
        if self.start is None:
            self.start = self.previous_end or self.mark(host_ns)
        return self.start

    def enter(self, name: str) -> int:
        """A phase starts now; returns the token ``exit`` takes."""
        self.begin()
        at = self.mark()
        if name == "data":
            self.data_seen = True
        elif name == "forward" and not self.forward_seen:
            self.forward_seen = True
            # Time from the previous step's end to the first forward is data loading, unless
            # the loop timed a data phase itself.
            if not self.data_seen and self.previous_end is not None:
                self._spans.append(("data", self.previous_end, at))
        token = self._next_token
        self._next_token += 1
        self._open[token] = (name, at)
        return token

    def exit(self, token: int) -> None:
        """The phase of ``token`` ends now (nothing if a step end cut it)."""
        opened = self._open.pop(token, None)
        if opened is not None:
            self._spans.append((opened[0], opened[1], self.mark()))

    def cut(self, host_ns: int) -> StepAxis:
        """The step ends at ``host_ns``: close it (open phases are cut here) and start the next
        one at the same instant."""
        end = self.mark(host_ns)
        start = self.begin(host_ns)
        for name, at in self._open.values():
            self._spans.append((name, at, end))
        self._open.clear()  # their exit, in the next step, records nothing
        axis = StepAxis(start=start, end=end, spans=sorted(self._spans, key=_by_start))
        self._spans = []
        self.start = None
        self.previous_end = end
        self.data_seen = self.forward_seen = False
        return axis


def _by_start(span: tuple[str, Mark, Mark]) -> int:
    return span[1].host_ns
