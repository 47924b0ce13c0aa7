"""StepAggregate: one optimizer step across the ranks that reported it, and every cluster figure
of a step as one of its properties (moved out of cluster.py, which holds the fold)."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

from .rank import StepSummary
from .stragglers import Standing

if TYPE_CHECKING:
    from .throughput import Throughput

# C-level reads of every rank's summary: a closed step of 16,384 ranks reads each a few times.
_WALL_NS = attrgetter("wall_ns")
_DURATION = attrgetter("duration_s")
_GRAD_NORM = attrgetter("grad_norm")
_OVERFLOW = attrgetter("overflow")


@dataclass(slots=True)
class StepAggregate:
    """One optimizer step across the ranks that reported it. Each cluster figure of a step is
    one property here, with its definition."""

    step: int
    summaries: dict[int, StepSummary] = field(default_factory=dict)
    samples: int = 0
    """Samples of the step: every rank's share added up (StepReport.samples)."""
    skipped: bool = False
    complete: bool = False
    standings: dict[int, Standing] = field(default_factory=dict)
    """Each rank against the others (zeroscope.state.stragglers), set when the step closes."""

    unpeered: bool = False
    """No rank set against another when the step closed: judged by stage (a pipeline) with
    each stage on one rank or their waits unmeasured, or one rank of a several-rank job
    reported the step. No slowest rank either."""

    reported_throughput: tuple[Throughput | None] | None = None
    """The closed step's cluster throughput, once worked out (throughput.reported_step)."""

    _closed: tuple[int, float, float | None, bool, float | None] | None = None
    """(wall_ns, step_time, exposed_s, overflow, grad_norm) frozen when the step closed (its
    reports are final): the alerts read the newest steps' every frame, the run's totals and the
    step line the norm, a pass over every rank each."""

    def close(self) -> None:
        self.complete = True
        self._closed = None
        figures = (self.wall_ns, self.step_time, self.exposed_s, self.overflow, self.grad_norm)
        self._closed = figures

    @property
    def wall_ns(self) -> int:
        """The step's end: the latest rank's step-end instant [ns, that rank's clock]."""
        if self._closed is not None:
            return self._closed[0]
        return max(map(_WALL_NS, self.summaries.values()))

    @property
    def step_time(self) -> float:
        """The step takes as long as its slowest rank (they meet at the next collective) [s]."""
        if self._closed is not None:
            return self._closed[1]
        return max(map(_DURATION, self.summaries.values()))

    @property
    def eval_time(self) -> float | None:
        """The longest rank's evaluation inside this step's time (an eval before it) [s]; None
        when no rank ran one."""
        times = [s.eval_s for s in self.summaries.values() if s.eval_s is not None]
        return max(times) if times else None

    @property
    def train_time(self) -> float:
        """The step's time less the evaluation in it: its slowest rank's [s] (the step time
        when no rank ran one). What the step's counted work (training forwards and backwards
        only) is a rate over."""
        if self.eval_time is None:
            return self.step_time
        return max(s.train_s for s in self.summaries.values())

    _median: float | None = None

    @property
    def median_time(self) -> float:
        """Median of the ranks' step times [s]. Cached: every rank's judgement uses it."""
        if self._median is None:
            self._median = statistics.median(map(_DURATION, self.summaries.values()))
        return self._median

    @property
    def slowest_rank(self) -> int | None:
        """The rank with the most compute (step - collective wait) beyond the others'; by step
        time before the step was judged (or with one rank); NA when the step cannot be judged
        for an unmeasured wait (every rank's step time is then the same, and the longest of
        them named an arbitrary rank: a DDP job on gloo named the wrong one), or when no rank
        has a peer to be set against (a pipeline whose every stage runs on one rank: its
        stages compute different layers, and their step times say nothing of slowness), or
        when one rank of several reported the step (a rank that ran an extra step under DDP's
        ``Join``, or the others' reports dropped: the one rank is nobody's slowest)."""
        if self.standings:
            return max(self.standings, key=lambda r: (self.standings[r].compute_excess_s, -r))
        if self.unpeered or (
            len(self.summaries) > 1 and any(s.unexposed for s in self.summaries.values())
        ):
            return None
        return max(self.summaries, key=lambda r: (self.summaries[r].duration_s, -r))

    @property
    def slowest_excess(self) -> float | None:
        """The slowest rank's compute excess over the median of the others [s]."""
        slowest = self.slowest_rank
        st = None if slowest is None else self.standings.get(slowest)
        return st.compute_excess_s if st else None

    @property
    def worst_memory_rank(self) -> int:
        """The rank holding the most device memory (P+G+O+A, NA read as 0; a tie goes to the
        lower rank)."""
        return self.memory()[0]

    _memory: tuple[int, list[int]] | None = None

    def memory(self) -> tuple[int, list[int]]:
        """(:attr:`worst_memory_rank`, every rank's reported P+G+O+A in arrival order) in one
        pass over the ranks, kept once the step closed: the step's history point reads both,
        and each rank's ``device_total`` is a property call (two passes were ~9 ms of a
        16,384-rank close)."""
        if self._memory is not None:
            return self._memory
        worst, top = -1, -1
        known: list[int] = []
        for r, s in self.summaries.items():
            total = s.device_total
            if total is not None:
                known.append(total)
            v = total or 0
            if worst < 0 or v > top or (v == top and r < worst):
                worst, top = r, v
        if self.complete:
            self._memory = (worst, known)
        return worst, known

    @property
    def loss(self) -> float | None:
        """The mean of the ranks' losses (each rank's own micro-batches); NA when no rank
        reported one."""
        losses = [s.loss for s in self.summaries.values() if s.loss is not None]
        return sum(losses) / len(losses) if losses else None

    @property
    def grad_norm(self) -> float | None:
        """The largest of the ranks' gradient norms, as their clipping (or DeepSpeed) reported
        them: under data parallelism every rank's is the same global norm. NaN where a rank's
        was (an overflowed fp16 step's); NA when no rank reported one (nothing clipped)."""
        if self._closed is not None:
            return self._closed[4]
        norms = [n for n in map(_GRAD_NORM, self.summaries.values()) if n is not None]
        if not norms:
            return None
        return math.nan if any(math.isnan(n) for n in norms) else max(norms)

    @property
    def loss_scale(self) -> float | None:
        return next((s.loss_scale for s in self.summaries.values() if s.loss_scale), None)

    @property
    def overflow(self) -> bool:
        """Some rank's optimizer step overflowed (fp16) in this step."""
        if self._closed is not None:
            return self._closed[3]
        return any(map(_OVERFLOW, self.summaries.values()))

    @property
    def exposed_s(self) -> float | None:
        """The cluster's exposed time: the least-exposed rank's wait in collectives [s]. The
        other ranks' extra wait is waiting for slower peers (a straggler), not communication
        cost; NA when no rank reported a collective, or no rank's wait was measured."""
        if self._closed is not None:
            return self._closed[2]
        waits = [s.exposed_s for s in self.summaries.values() if s.ops and not s.unexposed]
        return min(waits) if waits else None

    @property
    def exposed_unmeasured(self) -> bool:
        """Some rank reported collectives, but no rank's wait in them was measured."""
        return self.exposed_s is None and any(s.ops for s in self.summaries.values())

    @property
    def exposed_share(self) -> float | None:
        """Exposed %: the cluster's exposed time / step time [fraction]."""
        exposed = self.exposed_s
        step = self.step_time
        return exposed / step if exposed is not None and step > 0 else None
