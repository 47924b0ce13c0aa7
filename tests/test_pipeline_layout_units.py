"""Units of a pipeline job's layout as the attach reads it (agent/attach/pipeline_layout.py) and
of the final line's naming of the stage whose loss it shows (zeroscope/state/lines.py).

The oracle for the replica index is the mesh itself: every rank's pipeline is built here the
way ``init_device_mesh`` lays ranks out (pipeline outermost: each pipeline every ``dp``-th
rank; pipeline innermost: consecutive ranks), and each of the world's pipelines must get a
distinct index in ``range(dp)``, the same on every one of its stages.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from zeroscope.agent.attach.pipeline_layout import replica_of
from zeroscope.agent.schema import ParallelLayout
from zeroscope.state.lines import _last_stage


def _pipelines(pp: int, dp: int, outer: bool) -> list[list[int]]:
    """Every pipeline's global ranks (its stages in order) of a pp x dp mesh."""
    if outer:  # mesh (pp, dp): stage s of replica d is rank s * dp + d
        return [[s * dp + d for s in range(pp)] for d in range(dp)]
    return [[d * pp + s for s in range(pp)] for d in range(dp)]  # mesh (dp, pp)


@pytest.mark.parametrize("outer", [True, False])
@pytest.mark.parametrize(("pp", "dp"), [(2, 1), (2, 2), (4, 2), (2, 4), (8, 1), (3, 5)])
def test_each_pipeline_of_a_mesh_is_its_own_replica(pp: int, dp: int, outer: bool) -> None:
    world = pp * dp
    found = [replica_of(ranks, world) for ranks in _pipelines(pp, dp, outer)]
    assert all(f is not None and f[1] == dp for f in found)
    assert sorted(f[0] for f in found if f is not None) == list(range(dp))


def test_pipelines_that_do_not_tile_the_world_as_a_mesh_get_no_replica() -> None:
    assert replica_of([0, 2, 3], 6) is None  # uneven steps
    assert replica_of([1, 2], 4) is None  # consecutive but not aligned to the pipeline's size
    assert replica_of([0, 1, 2], 4) is None  # the world is no multiple of the pipeline
    assert replica_of([2, 5], 4) is None  # past the world


def _state(layouts: dict[int, ParallelLayout | None]) -> SimpleNamespace:
    ranks = {r: SimpleNamespace(hello=SimpleNamespace(parallel=lay)) for r, lay in layouts.items()}
    return SimpleNamespace(ranks=ranks)


def test_the_last_stage_is_the_rank_holding_the_last_stage_index() -> None:
    plain = {r: ParallelLayout(pp=r, pp_size=2) for r in range(2)}
    assert _last_stage(_state(plain)) == {1}  # type: ignore[arg-type]
    # Two replicas of two stages: both last-stage ranks.
    replicas = {r: ParallelLayout(pp=r % 2, pp_size=2, dp=r // 2, dp_size=2) for r in range(4)}
    assert _last_stage(_state(replicas)) == {1, 3}  # type: ignore[arg-type]
    # A V-shaped schedule (ZBV): rank 0 runs stages 0 and 3 of 4, so it computes the loss.
    v = {
        0: ParallelLayout(pp=0, pp_size=2, num_stages=4, stages=[0, 3]),
        1: ParallelLayout(pp=1, pp_size=2, num_stages=4, stages=[1, 2]),
    }
    assert _last_stage(_state(v)) == {0}  # type: ignore[arg-type]
    # No pipeline: no last stage.
    assert _last_stage(_state({0: None, 1: ParallelLayout(dp=1, dp_size=2)})) == set()  # type: ignore[arg-type]
