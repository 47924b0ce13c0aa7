"""A rank's step on one time axis: where the step starts and ends, and where each phase ran.

Every StepReport places its phases (``phase_spans``) and its collectives (``start_s``) on the
same axis: seconds since the step's start, the step starting where the previous one ended (step
1 at its first phase: ``initialize()``'s broadcasts before it are not the loop's time, and show
with a negative start). On
CPU the axis is the host clock (``perf_counter_ns``), which is when the work ran. On CUDA the
host only enqueues work and runs ahead of the device, so host instants are enqueue times: the
axis is the device's, from CUDA events recorded on the current stream at each mark (step end,
phase entry and exit) and read with ``elapsed_time`` once ``query()`` says they completed — the
host never waits for the device. A report whose events have not completed yet waits for them
(agent/outbox.py keeps it queued).

The training thread only appends raw marks, one tuple per phase entry or exit (the agent's overhead budget: each
line run there runs cold between the engine's kernels): ``(scope, host_ns, event)``, the
scope's first mark in a step being its entry and its second its exit, and ``(None, host_ns,
event)`` for the first thing that happened in step 1 when it was not a phase (a collective, a
transfer), and ``(LOOP_BEGIN, host_ns, event)`` where a frontend said step 1 begins (an HF
Trainer's ``on_step_begin``). :class:`StepTimeline` turns a step's marks into its
:class:`StepAxis` on the sender thread, in step order.

``step_end`` may be called inside a phase (the bundled engine reports from within its
optimizer phase): the open phase is cut there, its time so far belongs to the step that ends,
and the rest of it (after the cut) to nothing — it is time between steps, counted in the next
step's duration and its implicit "data" phase.
"""

from __future__ import annotations

from typing import Any

from .schema import Phases, PhaseSpan

PHASE_NAMES = ("data", "forward", "backward", "optimizer", "eval")

MAX_CUT_OPEN = 64
"""Phases left open across step ends that the timeline remembers (a scope entered by hand and
never exited must not grow the set forever)."""

RawMark = tuple[Any, int, Any]
"""(the phase's scope object or None, ``perf_counter_ns`` instant, CUDA event or None)."""


class LoopBegin:
    """The scope of the mark where a frontend said step 1 begins: no phase, never exited."""

    __slots__ = ()
    name = "begin"


LOOP_BEGIN = LoopBegin()


class StepAxis:
    """One finished step's marks (raw marks: ``(scope, host_ns, event)`` tuples, reused as
    they came from the training thread): its start, its end and its phases' (name, start,
    end)."""

    __slots__ = ("end", "forward_ns", "spans", "start")

    def __init__(
        self,
        start: RawMark,
        end: RawMark,
        spans: list[tuple[str, RawMark, RawMark]],
        forward_ns: int | None = None,
    ) -> None:
        self.start, self.end, self.spans = start, end, spans
        self.forward_ns = forward_ns
        """The host instant the step's first forward began (None: no forward in it)."""

    @property
    def forward_seen(self) -> bool:
        return self.forward_ns is not None

    @property
    def compute_ns(self) -> int | None:
        """Host nanoseconds from the step's first forward to its end: the step without its
        data loading and whatever ran between steps (agent/cadence.py ``observe``)."""
        return None if self.forward_ns is None else int(self.end[1]) - self.forward_ns

    @property
    def start_ns(self) -> int:
        return int(self.start[1])

    @property
    def start_event(self) -> Any:
        return self.start[2]

    def _events(self) -> list[Any]:
        marks = [self.start, self.end, *(m for _, a, b in self.spans for m in (a, b))]
        return [m[2] for m in marks if m[2] is not None]

    @property
    def device(self) -> bool:
        return self.start[2] is not None and self.end[2] is not None

    def ready(self, block: bool = False) -> bool:
        """Whether every device event completed (always on CPU). ``block`` waits (only at
        close, when the training loop is over)."""
        events = self._events()
        if block:
            for ev in events:
                ev.synchronize()
        return all(ev.query() for ev in events)

    def offset_s(self, mark: RawMark, device: bool) -> float:
        """Seconds from the step's start to ``mark``."""
        if device and mark[2] is not None:
            return float(self.start[2].elapsed_time(mark[2])) / 1e3
        return (mark[1] - self.start[1]) / 1e9

    def resolve(self, device: bool) -> tuple[float, Phases, list[PhaseSpan]]:
        """(duration, phase sums, phase spans) in seconds on the device axis when ``device``
        (events complete), else the host's."""
        spans = []
        sums: dict[str, float] = {}
        offset = self.offset_s
        for name, a, b in self.spans:
            start = offset(a, device)
            duration = offset(b, device) - start
            duration = duration if duration > 0.0 else 0.0
            spans.append(PhaseSpan(name, start, duration))
            if name in PHASE_NAMES:
                sums[name] = sums.get(name, 0.0) + duration
        duration = offset(self.end, device)
        return (duration if duration > 0.0 else 0.0), Phases(**sums), spans


class StepTimeline:
    """The sender's side: turns each step's raw marks into its axis, in step order (a step
    starts where the previous one ended; a phase cut by a step end ends in the next step)."""

    def __init__(self) -> None:
        self.previous_end: RawMark | None = None
        """Where the previous step ended (the next step's start); None before step 1."""
        self._cut: dict[int, Any] = {}
        """Scopes (by id; the value keeps each alive) open when an earlier step was cut:
        their next mark is the exit of a phase already accounted for."""

    def axis(self, marks: list[RawMark], end_ns: int, end_event: Any = None) -> StepAxis:
        """The axis of the step whose marks are ``marks`` and which ended at ``end_ns``."""
        end = (None, end_ns, end_event)
        previous = self.previous_end
        # Step 1 starts where the training loop's first step does: its first phase. What came
        # before it (the engine's init broadcasts, inside ``initialize()``) is reported in step
        # 1 with a negative start; with no phase at all, the first thing that happened.
        start = previous if previous is not None else _loop_start(marks, end)
        spans: list[tuple[str, RawMark, RawMark]] = []
        opened: dict[int, RawMark] = {}
        cut = self._cut
        data_seen = False
        forward_ns = None
        evals: list[tuple[RawMark, RawMark]] = []  # eval forwards before the first forward
        for mark in marks:
            scope = mark[0]
            if scope is None or scope is LOOP_BEGIN:
                continue
            key = id(scope)
            entered = opened.pop(key, None)
            if entered is not None:
                if forward_ns is None and scope.name == "eval":
                    evals.append((entered, mark))
                else:
                    spans.append((scope.name, entered, mark))
                continue
            if cut and cut.pop(key, None) is not None:  # the exit of a phase a step end cut
                continue
            name = scope.name
            if name == "data":
                data_seen = True
            elif name == "forward" and forward_ns is None:
                forward_ns = int(mark[1])
                # Time from the previous step's end to the first forward is data loading,
                # unless the loop timed a data phase itself. An evaluation in it (forwards
                # with autograd off, an HF Trainer's evaluate()) is one span from its first
                # entry to its last exit, its batches and metrics included; the time around
                # it stays the loop's own between steps (a trainer's logging before it, the
                # training batch after it), as in a step without one.
                if not data_seen and previous is not None:
                    since = previous
                    if evals:
                        spans.append(("data", previous, evals[0][0]))
                        spans.append(("eval", evals[0][0], evals[-1][1]))
                        since, evals = evals[-1][1], []
                    spans.append(("data", since, mark))
            opened[key] = mark
        if previous is not None:  # (before step 1: an evaluation before training, not its)
            spans.extend(("eval", a, b) for a, b in evals)
        for mark in opened.values():
            spans.append((mark[0].name, mark, end))
        if len(cut) > MAX_CUT_OPEN:  # entered by hand and never exited: forget them
            cut.clear()
        cut.update((key, mark[0]) for key, mark in opened.items())
        self.previous_end = end
        spans.sort(key=_by_start)
        return StepAxis(start, end, spans, forward_ns)


def _loop_start(marks: list[RawMark], end: RawMark) -> RawMark:
    """Step 1's start: where a frontend said it begins (before its first forward: a model its
    engine did not wrap ran that forward unseen), else its first phase mark (an evaluation's
    aside: one run before training, ``trainer.evaluate()`` first, is no part of the step), else
    its first mark (a collective, a transfer), else its end."""
    for mark in marks:
        if mark[0] is LOOP_BEGIN:
            return mark
    for mark in marks:
        if mark[0] is not None and mark[0].name != "eval":
            return mark
    return marks[0] if marks else end


def _by_start(span: tuple[str, RawMark, RawMark]) -> int:
    return int(span[1][1])
