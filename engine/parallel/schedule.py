"""torch.distributed.pipelining stages and schedules for a PipelineModule's chunks.

``pipeline.schedule`` in ds_config picks the schedule (1F1B by default, DeepSpeed's own
TrainSchedule is 1F1B too); the interleaved and zero-bubble ones need ``virtual_stages`` chunks
per rank in the placement they expect (round-robin, or a V for ZBV and DualPipeV).

The schedule's own plan, ``pipeline_order``, is kept for the viewer when it is a complete plan
for this rank. torch 2.13's ``Schedule1F1B._get_pipeline_order`` is not (on the last rank it
numbers forwards from 1 and plans a micro-batch that does not exist), so for it the viewer falls
back to the order the schedule really executed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from zeroscope.engine.config import ConfigError

from .pipe_module import PipelineModule


@dataclass(frozen=True, slots=True)
class ScheduleKind:
    cls: str
    multi: bool
    placement: str = "loop"
    zero_bubble: bool = False


SCHEDULES = {
    "gpipe": ScheduleKind("ScheduleGPipe", multi=False),
    "1f1b": ScheduleKind("Schedule1F1B", multi=False),
    "interleaved_1f1b": ScheduleKind("ScheduleInterleaved1F1B", multi=True),
    "looped_bfs": ScheduleKind("ScheduleLoopedBFS", multi=True),
    "interleaved_zero_bubble": ScheduleKind(
        "ScheduleInterleavedZeroBubble", multi=True, zero_bubble=True
    ),
    "zbv_zero_bubble": ScheduleKind(
        "ScheduleZBVZeroBubble", multi=True, placement="v", zero_bubble=True
    ),
    "dualpipev": ScheduleKind("ScheduleDualPipeV", multi=True, placement="v", zero_bubble=True),
}


def schedule_kind(name: str) -> ScheduleKind:
    """The schedule named ``name`` (ours, or torch's class name), or a one-line ConfigError."""
    key = name.lower().replace("-", "_")
    for known, kind in SCHEDULES.items():
        if key in (known, known.replace("_", ""), kind.cls.lower()):
            return kind
    raise ConfigError(f"pipeline.schedule {name!r} is not one of {sorted(SCHEDULES)}")


def check_placement(kind: ScheduleKind, module: PipelineModule) -> None:
    """The module's chunks must be laid out the way the schedule expects."""
    v, placement = module.virtual_stages, module.stage_placement
    if not kind.multi and v != 1:
        raise ConfigError(
            f"{kind.cls} runs one stage per rank; the PipelineModule has virtual_stages={v} "
            f"(use an interleaved schedule, or virtual_stages=1)"
        )
    if kind.multi and (v < 2 or placement != kind.placement):
        raise ConfigError(
            f"{kind.cls} needs PipelineModule(virtual_stages>=2, stage_placement="
            f"{kind.placement!r}); it has virtual_stages={v}, stage_placement={placement!r}"
        )


def build_schedule(
    kind: ScheduleKind,
    module: PipelineModule,
    *,
    microbatches: int,
    loss_fn: Callable[..., Any],
    device: torch.device,
) -> tuple[Any, list[Any]]:
    """(schedule, stages) for this rank's chunks over the module's ``pp`` group."""
    from torch.distributed import pipelining

    group = module.mesh.group("pp")
    stages = [
        pipelining.PipelineStage(chunk, chunk.stage_index, module.total_chunks, device, group=group)
        for chunk in module.chunks
    ]
    cls = getattr(pipelining, kind.cls)
    first = stages if kind.multi else stages[0]
    # scale_grads=False: the engine scales the loss by 1/micro-batches (and the fp16 loss scale)
    # itself, as DeepSpeed's engine.backward does.
    schedule = cls(first, microbatches, loss_fn=loss_fn, scale_grads=False)
    return schedule, stages


def _compute_actions(action: Any) -> list[Any]:
    subs = getattr(action, "sub_actions", None)
    if subs:
        return [a for s in subs for a in _compute_actions(s)]
    kind = getattr(getattr(action, "computation_type", None), "value", None)
    return [action] if kind in ("F", "B", "I", "W") else []


def planned_order(schedule: Any, rank: int, stages: list[int], microbatches: int) -> list[str]:
    """This rank's compute actions from ``schedule.pipeline_order`` as ``"<stage><kind><mb>"``
    strings, or [] when that plan is incomplete or inconsistent (see the module docstring)."""
    order = getattr(schedule, "pipeline_order", None) or {}
    actions = [a for item in order.get(rank) or [] if item for a in _compute_actions(item)]
    seen = {(a.stage_index, a.computation_type.value, a.microbatch_index) for a in actions}
    for s in stages:
        for mb in range(microbatches):
            backward = (s, "B", mb) in seen or {(s, "I", mb), (s, "W", mb)} <= seen
            if (s, "F", mb) not in seen or not backward:
                return []
    if len(seen) != len(actions) or any(
        a.stage_index not in stages or not 0 <= a.microbatch_index < microbatches for a in actions
    ):
        return []
    return [f"{a.stage_index}{a.computation_type.value}{a.microbatch_index}" for a in actions]
