"""Which pipeline stage each rank of a pipeline job runs, put in its Hello (``ParallelLayout``),
for ``torch.distributed.pipelining`` schedules and DeepSpeed's ``PipelineEngine``.

The stages of a pipeline compute different layers by design, so their step times differ by
design too. Without a layout the viewer took the ranks for data-parallel replicas: it judged
stage 0 against stage 1 and named the lighter one's peer a straggler ("slowest r0 (+1.9ms
compute)" on a two-stage job), and its final-loss line read "r1 only: 1 of 2 ranks" where only
the last stage computes a loss. With the layout, zeroscope/state judges each rank against the
replicas of its own stage (``judge_by_stage``, as for the bundled engine's pipeline), and names
the last stage as the loss's source.

- ``torch.distributed.pipelining``: the first ``step()`` of each schedule (``PipelineScheduleSingle``
  and ``PipelineScheduleMulti``, which every schedule class derives from) reads its stage or
  stages: the rank's place in the pipeline group (``group_rank`` of ``group_size``), the stage
  indices it runs (several with the interleaved and zero-bubble schedules), the stages in all
  and the micro-batches. Which replica (data-parallel index) the pipeline is comes from its
  group's ranks where they form the usual mesh (consecutive ranks, or a stride of the
  replicas); anything else is said once and sent without a layout, rather than a made-up one.
- DeepSpeed: its engine's process grid (``engine.grid``) gives the stage, replica and
  model-parallel slice exactly.

The schedule's name is not sent: the Pipeline screen reads it as "this rank reports its timed
stage actions", which only the bundled engine does.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

from zeroscope.agent.schema import ParallelLayout

from . import patches
from .session import SESSION

PART = "the stages of torch.distributed.pipelining schedules"
"""What the attach says it lost when a schedule's stages cannot be read."""


def replica_of(ranks: list[int], world: int) -> tuple[int, int] | None:
    """(data-parallel index, data-parallel size) of the pipeline made of the global ``ranks``
    (its stages in order), where the pipelines tile the world as a mesh does: consecutive
    ranks (pipeline ``k`` is ``k*pp ... k*pp+pp-1``) or every ``dp``-th rank (pipeline ``k``
    is ``k, k+dp, ...``); None otherwise."""
    pp = len(ranks)
    if pp < 1 or world % pp:
        return None
    dp = world // pp
    first = ranks[0]
    if ranks == list(range(first, first + pp)) and first % pp == 0:
        return first // pp, dp
    if ranks == list(range(first, world, dp)) and first < dp:
        return first, dp
    return None


def schedule_layout(schedule: Any) -> ParallelLayout | None:
    """This rank's layout from a ``torch.distributed.pipelining`` schedule (None: no mesh)."""
    import torch.distributed as dist

    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    first = stages[0]
    group = first.group
    world = dist.get_world_size()
    ranks = list(dist.get_process_group_ranks(group)) if group is not None else list(range(world))
    replica = replica_of(ranks, world)
    if replica is None:
        return None
    return ParallelLayout(
        dp=replica[0],
        pp=int(first.group_rank),
        dp_size=replica[1],
        pp_size=int(first.group_size),
        microbatches=int(schedule._n_microbatches),
        num_stages=int(first.num_stages),
        stages=[int(s.stage_index) for s in stages],
    )


def grid_layout(engine: Any) -> ParallelLayout:
    """This rank's layout from a DeepSpeed ``PipelineEngine``'s process grid."""
    grid = engine.grid
    return ParallelLayout(
        dp=int(grid.get_data_parallel_rank()),
        pp=int(grid.get_stage_id()),
        tp=int(grid.get_slice_parallel_rank()),
        dp_size=int(grid.get_data_parallel_world_size()),
        pp_size=int(grid.get_pipe_parallel_world_size()),
        tp_size=int(grid.get_slice_parallel_world_size()),
        microbatches=int(engine.micro_batches),
        num_stages=int(engine.num_stages),
        stages=[int(grid.get_stage_id())],
    )


def wrap_schedules(module: ModuleType) -> None:
    """Wrap ``step`` of the two schedule bases in ``module`` (torch's ``schedules``)."""
    seen: weakref.WeakSet[Any] = weakref.WeakSet()
    for base in (module.PipelineScheduleSingle, module.PipelineScheduleMulti):
        patches.replace(base, "step", _first_step_says_layout(base.step, seen))


def _first_step_says_layout(step: Any, seen: weakref.WeakSet[Any]) -> Any:
    def step_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self not in seen and not SESSION.passive:
            seen.add(self)
            _say_layout(self)
        return step(self, *args, **kwargs)

    step_.__doc__ = step.__doc__
    return step_


def _say_layout(schedule: Any) -> None:
    try:
        layout = schedule_layout(schedule)
    except Exception as exc:  # a torch that moved a name: judged as before, and said
        SESSION.lost(PART, f"unreadable ({exc!r})")
        return
    if layout is None:
        SESSION.lost(PART, "the pipeline groups do not tile the ranks as a mesh")
        return
    SESSION.set_layout(layout)
