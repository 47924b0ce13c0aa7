"""The Communication screen's and the rank screen's ops view-models: volume per step against the
traffic model (with its level, ``AlertRules.traffic_level``), busbw per op over time, and the
exposed share against the exposed alert's threshold (``AlertRules.exposed_level``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from zeroscope.state.alerts import Level
from zeroscope.state.history import (
    OUTSIDE_TRAFFIC_MODEL,
    busbw_series,
    median_rank,
    model_volume,
    volume_series,
)
from zeroscope.state.prediction import TrafficPrediction, paper_differences, predicted_traffic
from zeroscope.state.rank import OpTotals

if TYPE_CHECKING:
    from zeroscope.state.cluster import ClusterState
    from zeroscope.state.rank import StepSummary


@dataclass(frozen=True, slots=True)
class CommView:
    volume: list[float | None]
    """Measured volume per rank per step (the median rank's), oldest first."""
    last_volume: float | None
    predicted: TrafficPrediction | None
    ratio: float | None
    """Last step's volume over the prediction, less :attr:`outside_model` (the model's own
    traffic is not in it)."""
    ratio_level: Level
    paper_ratio: float | None
    differences: list[str]
    """Why the paper's 2Ψ / 3Ψ differs from the engine's traffic for this config."""
    busbw: dict[str, list[float | None]]
    """Per op asked for and measured at least once: the median rank's busbw per step."""
    busbw_last: dict[str, tuple[float, int]]
    """Per op of ``busbw``: its newest measured busbw and how many steps before the newest one
    it was measured (0: in the newest step). An op run once at start-up (the initial
    broadcast) keeps its figure, said as old, rather than reading NA beside its own point."""
    exposed: list[float | None]
    """The cluster's exposed share per step (the least-exposed rank's)."""
    exposed_last: float | None
    exposed_level: Level
    exposed_limit: float
    outside_model: dict[str, float] = field(default_factory=dict)
    """The last step's volume of each op the traffic model does not hold
    (``OUTSIDE_TRAFFIC_MODEL``: an expert-parallel layer's all-to-all), the median rank's; only
    those it moved."""
    busbw_none: str = "no collectives reported"
    """What the busbw pane says when no op has a measured busbw: none reported, or reported
    with no clock to time them (DDP's buckets on gloo: bytes and counts exact, time unknown)."""


def comm_view(state: ClusterState, ops: Iterable[str]) -> CommView:
    series = volume_series(state)
    latest = state.latest()
    closed = latest if latest is not None and latest.complete else None
    # The newest step only (a series over every kept step would be ranks x steps a frame):
    # the volume the model is held against, and what it leaves out.
    last = None if closed is None else median_rank(closed, model_volume)
    expected = predicted_traffic(state)
    ratio = expected.ratio(last) if expected else None
    outside = {
        op: v
        for op in OUTSIDE_TRAFFIC_MODEL
        if closed is not None and (v := median_rank(closed, partial(_op_volume, op=op)))
    }
    c, p = state.config, state.params
    busbw = {op: busbw_series(state, op) for op in ops}
    exposed = [a.exposed_share for a in state.complete_steps()]
    exposed_last = exposed[-1] if exposed else None
    return CommView(
        volume=series,
        last_volume=series[-1] if series else None,
        predicted=expected,
        ratio=ratio,
        ratio_level=state.rules.traffic_level(ratio),
        paper_ratio=expected.paper_ratio(last) if expected else None,
        differences=paper_differences(c, p) if c is not None and p is not None else [],
        busbw={op: s for op, s in busbw.items() if any(v is not None for v in s)},
        busbw_last={op: newest for op, s in busbw.items() if (newest := _newest(s)) is not None},
        exposed=exposed,
        exposed_last=exposed_last,
        exposed_level=state.rules.exposed_level(exposed_last),
        exposed_limit=state.rules.exposed_max,
        outside_model=outside,
        busbw_none=(
            "busbw NA: no clock timed the collectives reported (bytes and counts are exact, "
            "their time unknown: docs/engines/timing.md)"
            if any(series)
            else "no collectives reported"
        ),
    )


def _op_volume(s: StepSummary, op: str) -> float | None:
    totals = s.ops.get(op)
    return totals.volume if totals is not None else None


def _newest(series: list[float | None]) -> tuple[float, int] | None:
    for ago, value in enumerate(reversed(series)):
        if value is not None:
            return value, ago
    return None


@dataclass(frozen=True, slots=True)
class RankCommView:
    ops: list[tuple[str, OpTotals]]
    """The rank's collectives of its newest step, by op name."""
    exposed_s: float | None
    exposed_share: float | None
    exposed_level: Level


def rank_comm_view(state: ClusterState, rank: int) -> RankCommView | None:
    """A rank's newest step's collectives and its exposed share, judged; None before it
    reported a step."""
    rs = state.ranks.get(rank)
    s = rs.summary if rs else None
    if s is None:
        return None
    return RankCommView(
        ops=sorted(s.ops.items()),
        exposed_s=s.exposed,
        exposed_share=s.exposed_share,
        exposed_level=state.rules.exposed_level(s.exposed_share),
    )
