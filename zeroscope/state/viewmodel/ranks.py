"""The rank table's and the heatmap's view-model: one flat record per rank with its slowness
judged (``AlertRules.slowness_level``), and the heatmap's bands (``AlertRules.heat_levels``).

Computed once per state change and shared by the table and the heatmap, so a 1024-rank frame
judges once and draws only the visible rows (zeroscope/tui/rank_rows.py sorts and filters).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zeroscope.state.alerts import HEAT_METRICS, AlertRules, Level
from zeroscope.state.pipeline import layout_of

from .throughput import Throughput, rank_throughput

if TYPE_CHECKING:
    from zeroscope.state.cluster import ClusterState


@dataclass(slots=True)
class RankRow:
    rank: int
    host: str
    params: int | None
    grads: int | None
    optim: int | None
    activations: int | None
    total: int | None
    step: int | None
    step_time: float | None
    slowness: float | None
    slowness_level: Level
    exposed: float | None
    offload_bw: float | None
    loss_scale: float | None
    flag: str
    """"" or a short word: raised, killed, died, exited, silent, mem!, slow, comm, drops."""
    mesh: tuple[int, int, int] | None = None
    """(pp, dp, tp) of a 3D-parallel job's rank: the table groups by stage, then replica."""
    throughput: Throughput | None = None
    """The newest step's tokens/s, model TFLOP/s and MFU; None when the rank reported no work
    (the table then leaves the columns out)."""


def rank_rows(
    state: ClusterState, flagged: dict[int, str] | None = None, ranks: Iterable[int] | None = None
) -> list[RankRow]:
    """Every rank's row, or only those of ``ranks`` (one node's, in the node drill-down: a
    16,384-rank job then judges 8 rows, not all of them)."""
    rows = []
    flagged = flagged or {}
    chosen = (
        state.ranks.items()
        if ranks is None
        else [(r, state.ranks[r]) for r in ranks if r in state.ranks]
    )
    for r, rs in chosen:
        s = rs.summary
        layout = layout_of(rs.hello)
        slowness = state.slowness(r)
        rows.append(
            RankRow(
                rank=r,
                host=rs.hostname,
                params=s.params if s else None,
                grads=s.grads if s else None,
                optim=s.optim if s else None,
                activations=s.activations if s else None,
                total=s.device_total if s else None,
                step=s.step if s else None,
                step_time=s.duration_s if s else None,
                slowness=slowness,
                slowness_level=state.rules.slowness_level(slowness),
                exposed=s.exposed_share if s else None,
                offload_bw=s.offload_bw if s else None,
                loss_scale=s.loss_scale if s else None,
                flag=flagged.get(r, ""),
                mesh=None if layout is None else (layout.pp, layout.dp, layout.tp),
                throughput=rank_throughput(rs),
            )
        )
    return rows


def heat_value(row: RankRow, metric: str) -> float | None:
    """The figure the heatmap colours for ``metric`` (one of HEAT_METRICS)."""
    return {
        "slowness": row.slowness,
        "memory": row.total,
        "exposed": row.exposed,
        "step": row.step_time,
    }[metric]


@dataclass(frozen=True, slots=True)
class HeatView:
    values: list[float | None]
    bands: list[int | None]
    """Each rank's band, 0 (coolest) to 3; None where NA."""
    cuts: tuple[float, float, float]
    """The three cuts between the bands (for the legend): absolute for slowness and exposed,
    shares of the largest rank's for memory and step."""


def heat_view(rules: AlertRules, metric: str, rows: list[RankRow]) -> HeatView:
    """The heatmap's cells for ``rows`` (in the order given) coloured by ``metric``."""
    if metric not in HEAT_METRICS:
        raise ValueError(f"unknown heat metric {metric!r}")
    values = [heat_value(row, metric) for row in rows]
    return HeatView(values, rules.heat_levels(metric, values), rules.heat_cuts(metric))
