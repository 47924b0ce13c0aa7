"""Per-step series for the over-time views (the Comm screen's sparklines today, history plots
later): one value per complete step, oldest first, None where no rank reported the figure.

A cluster series of a per-rank figure is the *median rank's* value in each step: robust to
one outlier rank (a straggler, a rank whose report was dropped) and shown as such.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

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
    out: list[float | None] = []
    for agg in state.complete_steps():
        known = [v for s in agg.summaries.values() if (v := figure(s)) is not None]
        out.append(statistics.median(known) if known else None)
    return out


def volume_series(state: ClusterState) -> list[float | None]:
    """The median rank's communication volume per step (StepSummary.comm_volume) [bytes]."""
    return median_rank_series(state, lambda s: s.comm_volume)


def busbw_series(state: ClusterState, op: str) -> list[float | None]:
    """The median rank's busbw of ``op`` per step (OpTotals.busbw) [bytes/s]."""
    return median_rank_series(state, lambda s: s.ops[op].busbw if op in s.ops else None)


def rank_series(
    state: ClusterState, rank: int, figure: Callable[[StepSummary], float | None]
) -> list[tuple[int, float | None]]:
    """(step, figure) of one rank's kept history (RankState.history), oldest first."""
    rs = state.ranks.get(rank)
    return [] if rs is None else [(s.step, figure(s)) for s in rs.history]
