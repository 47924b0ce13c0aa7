"""The Pipeline, Loss-scale and Advice screens' view-models (and the ``advise`` command's):
the values each shows with their judgement, so the screens only draw and word them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zeroscope.state.advice.model import ms, nbytes
from zeroscope.state.alerts import Level
from zeroscope.state.history import skipped_steps
from zeroscope.state.pipeline import PipelineView, pipeline_view

if TYPE_CHECKING:
    from zeroscope.agent.schema import Event
    from zeroscope.state.cluster import ClusterState


def judged_pipeline(state: ClusterState, *, dp: int = 0, tp: int = 0) -> PipelineView | None:
    """Replica (dp, tp)'s pipeline in its newest step, each stage's ``bubble_level`` judged
    against its schedule's plan (``AlertRules.bubble_level``); None before it reported one."""
    view = pipeline_view(state.ranks.values(), dp=dp, tp=tp)
    if view is not None:
        for row in view.rows:
            row.bubble_level = state.rules.bubble_level(row.bubble_fraction, row.planned_bubble)
    return view


EVENT_LEVELS: dict[str, Level] = {
    "scale_at_minimum": "bad",
    "nan_loss": "bad",
    "overflow": "warn",
}
"""How bad each loss-scale event is; the rest (a scale change) is news, judged ``ok``."""


@dataclass(frozen=True, slots=True)
class LossScaleView:
    steps: list[int]
    scales: list[float | None]
    log2_scales: list[float | None]
    """log2 of each scale (the chart's axis); NA where no positive scale was reported."""
    overflow: list[bool]
    skipped: int
    """Steps the optimizer skipped (an fp16 overflow) among ``steps``."""
    events: list[tuple[Event, Level]]


def loss_scale_view(state: ClusterState) -> LossScaleView:
    steps = state.complete_steps()
    scales = [a.loss_scale for a in steps]
    return LossScaleView(
        steps=[a.step for a in steps],
        scales=scales,
        log2_scales=[math.log2(v) if v is not None and v > 0 else None for v in scales],
        overflow=[a.overflow for a in steps],
        skipped=skipped_steps(steps),
        events=[(e, EVENT_LEVELS.get(e.event, "ok")) for e in state.scale_events()],
    )


def price_words(saves_ms: float | None, saves_bytes: float | None) -> list[str]:
    """An advice's price in words: ``saves 12.0 ms/step``, ``costs 1.2 GB/rank`` (a negative
    saving is a cost)."""
    parts = []
    if saves_ms is not None:
        parts.append(f"{'saves' if saves_ms >= 0 else 'costs'} {ms(abs(saves_ms) / 1e3)}/step")
    if saves_bytes is not None:
        parts.append(f"{'saves' if saves_bytes >= 0 else 'costs'} {nbytes(abs(saves_bytes))}/rank")
    return parts
