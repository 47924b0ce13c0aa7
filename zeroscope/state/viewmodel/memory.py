"""The Memory screen's view-model: per rank and model-state part, measured beside the ZeRO
formulas' prediction, with the deviation and its level (``AlertRules.memory_level``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from zeroscope.state.alerts import Level
from zeroscope.state.formulas import ModelStateBytes
from zeroscope.state.prediction import deviation, predicted_memory, rank_grads

if TYPE_CHECKING:
    from zeroscope.state.cluster import ClusterState

PARTS = ("P", "G", "O", "host")
"""The judged parts, in the screen's column order: device P, G, O, then host (offload)."""


@dataclass(frozen=True, slots=True)
class PartCell:
    measured: float | None
    predicted: float | None
    deviation: float | None
    """(measured - predicted) / predicted; NA when either is missing or nothing is predicted."""
    level: Level
    word: str | None = None
    """Where nothing is predicted (0 bytes): ``new`` when the rank holds some anyway (bad),
    ``ok`` when it holds none; None otherwise (the deviation speaks)."""


@dataclass(frozen=True, slots=True)
class MemoryRow:
    rank: int
    parts: tuple[PartCell, ...]
    """One cell per :data:`PARTS`."""
    activations: int | None
    params: int | None
    frozen_params: int | None


@dataclass(frozen=True, slots=True)
class MemoryView:
    predicted: ModelStateBytes | None
    basis: str
    """Which config the prediction is for, or why it is NA."""
    rows: list[MemoryRow]
    any_frozen: bool
    grads_by_rank: bool = False
    """G is predicted for each rank apart (the engine says what each keeps): the row's cell
    holds it, and the job's figure in ``predicted`` is not every rank's."""


def part_cell(state: ClusterState, measured: float | None, predicted: float | None) -> PartCell:
    """One part's cell and its judgement."""
    dev = deviation(measured, predicted)
    if dev is not None:
        return PartCell(measured, predicted, dev, state.rules.memory_level(dev))
    if measured is not None and predicted == 0:
        held = bool(measured)
        return PartCell(measured, predicted, None, "bad" if held else "ok", "new" if held else "ok")
    return PartCell(measured, predicted, None, "na")


def memory_view(state: ClusterState) -> MemoryView:
    """Every rank's parts against the prediction for the job's config: one for all ranks
    (they hold the same shard sizes), but G where the engine says what each rank keeps
    (zeroscope.state.prediction.rank_grads)."""
    m, basis = predicted_memory(state)
    rows = []
    for r, rs in sorted(state.ranks.items()):
        s = rs.summary
        measured = (s.params, s.grads, s.optim, s.host_bytes) if s else (None,) * 4
        predicted = (m.params, rank_grads(state, r, m), m.optim, m.host_total) if m else (None,) * 4
        rows.append(
            MemoryRow(
                rank=r,
                parts=tuple(part_cell(state, a, b) for a, b in zip(measured, predicted)),
                activations=s.activations if s else None,
                params=s.params if s else None,
                frozen_params=s.frozen_params if s else None,
            )
        )
    by_rank = m is not None and any(row.parts[1].predicted != m.grads for row in rows)
    return MemoryView(m, basis, rows, any(row.frozen_params for row in rows), by_rank)
