"""Per-step series for the over-time views (the Comm screen's sparklines, the history plots of
the cluster and rank screens): one value per complete step, oldest first, None where no rank
reported the figure.

A cluster series of a per-rank figure is the *median rank's* value in each step: robust to
one outlier rank (a straggler, a rank whose report was dropped) and shown as such. The history
plots read :class:`StepSeries`, whose points ClusterState freezes as each step closes.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING

from .throughput import reported_step

if TYPE_CHECKING:
    from .cluster import ClusterState, StepAggregate
    from .rank import StepSummary


def step_series(
    state: ClusterState, figure: Callable[[StepAggregate], float | None]
) -> list[tuple[int, float | None]]:
    """(step, figure of the step) for every complete step kept in history."""
    return [(a.step, figure(a)) for a in state.complete_steps()]


def median_rank_series(
    state: ClusterState, figure: Callable[[StepSummary], float | None]
) -> list[float | None]:
    """Per complete step: the median over ranks of a per-rank figure (ranks without it left
    out; None when none has it)."""
    return [median_rank(agg, figure) for agg in state.complete_steps()]


def median_rank(agg: StepAggregate, figure: Callable[[StepSummary], float | None]) -> float | None:
    """One step's median over ranks of a per-rank figure (ranks without it left out; None when
    none has it)."""
    known = [v for s in agg.summaries.values() if (v := figure(s)) is not None]
    return statistics.median(known) if known else None


def volume_series(state: ClusterState) -> list[float | None]:
    """The median rank's communication volume per step (StepSummary.comm_volume) [bytes]."""
    return median_rank_series(state, lambda s: s.comm_volume)


OUTSIDE_TRAFFIC_MODEL = ("all_to_all",)
"""Ops the engine's traffic model (zeroscope.state.prediction: parameters and gradients) does
not hold: an expert-parallel layer's token routing moves activations, sized by the batch."""


def model_volume(s: StepSummary) -> float:
    """A step's volume the traffic model is to be held against: all of it but
    :data:`OUTSIDE_TRAFFIC_MODEL`'s [bytes]."""
    return s.comm_volume - sum(s.ops[op].volume for op in OUTSIDE_TRAFFIC_MODEL if op in s.ops)


def busbw_series(state: ClusterState, op: str) -> list[float | None]:
    """The median rank's busbw of ``op`` per step (OpTotals.busbw) [bytes/s]."""
    return median_rank_series(state, lambda s: s.ops[op].busbw if op in s.ops else None)


def rank_series(
    state: ClusterState, rank: int, figure: Callable[[StepSummary], float | None]
) -> list[tuple[int, float | None]]:
    """(step, figure) of one rank's kept history (RankState.history), oldest first."""
    rs = state.ranks.get(rank)
    return [] if rs is None else [(s.step, figure(s)) for s in rs.history]


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One closed step's cluster figures for the history plots, frozen when the step closed
    (late reports of a closed step change no figure, as for StepAggregate)."""

    step: int
    step_time: float
    """The cluster's step time: the slowest rank's (StepAggregate.step_time) [s]."""
    median_time: float
    """The median rank's step time (StepAggregate.median_time) [s]."""
    straggler: int | None
    """The rank flagged as a straggler in this step (the straggler alert stood: its compute was
    over the others' by the margin in ``straggler_steps`` of its last ``straggler_window`` steps,
    stragglers.py), from the first over-step of that streak on; None if none."""
    loss: float | None
    """The ranks' mean loss (StepAggregate.loss)."""
    loss_scale: float | None
    overflow: bool
    exposed: float | None
    """The cluster's exposed share (the least-exposed rank's wait / step time) [fraction]."""
    median_exposed: float | None
    """The median rank's exposed share [fraction]: what one rank's is held against."""
    memory_rank: int
    """The rank holding the most device memory (P+G+O+A) in this step."""
    params: int | None
    grads: int | None
    optim: int | None
    activations: int | None
    """That rank's P, G, O, A on the device [bytes]; None = not reported."""
    host: int
    """That rank's offloaded P+G+O in host memory [bytes]."""
    median_memory: float | None
    """The median rank's device P+G+O+A [bytes]."""
    offload_bw: float | None
    """The median offload bandwidth of the ranks that moved data [bytes/s]; None if none did."""
    mfu: float | None = None
    """The cluster's MFU in this step [fraction] (zeroscope.state.throughput.cluster_step);
    None where NA or no rank reported its work."""
    tokens_per_s: float | None = None
    """The cluster's tokens/s in this step; None where NA or not reported."""


def _median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


_EXPOSED_SHARE = attrgetter("exposed_share")
_OFFLOAD_BW = attrgetter("offload_bw")


def step_point(agg: StepAggregate, straggler: int | None) -> StepPoint:
    """The history figures of one closed (and judged) step; ``straggler``: the rank flagged."""
    worst, device_totals = agg.memory()
    w = agg.summaries[worst]
    summaries = agg.summaries.values()
    return StepPoint(
        step=agg.step,
        step_time=agg.step_time,
        median_time=agg.median_time,
        straggler=straggler,
        loss=agg.loss,
        loss_scale=agg.loss_scale,
        overflow=agg.overflow,
        exposed=agg.exposed_share,
        median_exposed=_median(map(_EXPOSED_SHARE, summaries)),
        memory_rank=worst,
        params=w.params,
        grads=w.grads,
        optim=w.optim,
        activations=w.activations,
        host=w.host_bytes,
        median_memory=statistics.median(device_totals) if device_totals else None,
        offload_bw=_median(map(_OFFLOAD_BW, summaries)),
        **_throughput(agg),
    )


def _throughput(agg: StepAggregate) -> dict[str, float | None]:
    """The cluster's MFU and tokens/s of the step (none computed when no rank reported work:
    a trace from before the figures existed pays nothing for them)."""
    t = reported_step(agg)
    return {} if t is None else {"mfu": t.mfu, "tokens_per_s": t.tokens_per_s}


class StepSeries:
    """The cluster's history over steps (one StepPoint per closed step, oldest first, the last
    ``limit``), kept by ClusterState as steps close: a plot reads it in O(steps), never
    O(steps x ranks), which keeps a 1024-rank frame cheap."""

    def __init__(self, limit: int) -> None:
        self.points: deque[StepPoint] = deque(maxlen=limit)
        self.version = 0
        """Bumped when a point is added: a plot redraws only when its series moved."""

    def add(self, point: StepPoint, flagged_since: int | None = None) -> None:
        """Append a step; a straggler flagged from an earlier step (``flagged_since``) marks
        the kept points back to that step: the streak that raised the flag."""
        if point.straggler is not None and flagged_since is not None:
            for i in range(len(self.points) - 1, -1, -1):
                p = self.points[i]
                if p.step < flagged_since or p.straggler is not None:
                    break
                self.points[i] = replace(p, straggler=point.straggler)
        self.points.append(point)
        self.version += 1

    def at(self, step: int) -> StepPoint | None:
        """The point of ``step`` (None when not kept)."""
        for p in reversed(self.points):
            if p.step == step:
                return p
            if p.step < step:
                return None
        return None


def rank_beside_cluster(
    state: ClusterState,
    rank: int,
    figure: Callable[[StepSummary], float | None],
    cluster: Callable[[StepPoint], float | None],
    series: StepSeries | None = None,
) -> tuple[list[int], list[float | None], list[float | None]]:
    """(steps, the rank's figure, the cluster's figure) over the rank's kept history, aligned
    by step: the rank detail's "this rank beside the cluster median". ``series`` defaults to
    the state's own (replay passes the whole run's)."""
    rs = state.ranks.get(rank)
    if rs is None:
        return [], [], []
    by_step = {p.step: p for p in (series or state.series).points}
    steps, mine, theirs = [], [], []
    for s in rs.history:
        p = by_step.get(s.step)
        steps.append(s.step)
        mine.append(figure(s))
        theirs.append(cluster(p) if p is not None else None)
    return steps, mine, theirs


def stacked_parts(
    parts: dict[str, list[int | None]], order: tuple[str, ...] = ("P", "G", "O", "A")
) -> dict[str, list[float | None]]:
    """Each part's band top in a stacked memory chart: P, then P+G, P+G+O, P+G+O+A (the
    device's model-state total), summing the parts reported at each step (None where none
    was)."""
    out: dict[str, list[float | None]] = {}
    running: list[list[int | None]] = []
    for name in order:
        running.append(parts[name])
        tops: list[float | None] = []
        for row in zip(*running):
            known = [v for v in row if v is not None]
            tops.append(sum(known) if known else None)
        out[name] = tops
    return out


def skipped_steps(steps: Iterable[StepAggregate]) -> int:
    """How many of ``steps`` the optimizer skipped (an fp16 overflow)."""
    return sum(1 for a in steps if a.skipped)
