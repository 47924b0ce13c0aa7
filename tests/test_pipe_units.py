"""The pipeline API's pieces against DeepSpeed's own (partitioning, topologies), the schedule
plan check, the ds_config blocks, and the refusals (one 2-rank launch)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

from tests.distributed import run_ranks
from zeroscope.engine.config import ConfigError, load_config
from zeroscope.engine.parallel.partition import partition_balanced, partition_uniform
from zeroscope.engine.parallel.schedule import planned_order
from zeroscope.engine.parallel.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
)


def test_partitions_equal_deepspeeds() -> None:
    from deepspeed.runtime.utils import partition_balanced as ds_balanced
    from deepspeed.runtime.utils import partition_uniform as ds_uniform

    rng = random.Random(3)
    for _ in range(400):
        n, parts = rng.randint(1, 14), rng.randint(1, 6)
        weights = [rng.choice([0, 1, 2, 3, 7, 50, 1000]) for _ in range(n)]
        assert partition_balanced(weights, parts) == ds_balanced(weights, parts), weights
        assert partition_uniform(n, parts) == ds_uniform(n, parts)


def test_topologies_equal_deepspeeds() -> None:
    from deepspeed.runtime.pipe import topology as ds

    for ours, theirs in [
        (PipeDataParallelTopology(2, 3), ds.PipeDataParallelTopology(2, 3)),
        (PipeModelDataParallelTopology(2, 2, 2), ds.PipeModelDataParallelTopology(2, 2, 2)),
        (PipeModelDataParallelTopology(3, 1, 2), ds.PipeModelDataParallelTopology(3, 1, 2)),
    ]:
        assert ours.world_size() == theirs.world_size()
        for rank in range(ours.world_size()):
            assert tuple(ours.get_coord(rank)) == tuple(theirs.get_coord(rank))
            assert ours.get_rank_repr(rank) == theirs.get_rank_repr(rank)
        for axis in ours.get_axis_names():
            assert ours.get_axis_comm_lists(axis) == theirs.get_axis_comm_lists(axis)
            assert ours.get_axis_list(axis, 0) == theirs.get_axis_list(axis, 0)
        assert ours.filter_match(pipe=1) == theirs.filter_match(pipe=1)


def _plan(rows: dict[int, list[str]]) -> Any:
    from torch.distributed.pipelining.schedules import _Action

    class Schedule:
        def __init__(self) -> None:
            self.pipeline_order = {
                r: [_Action.from_str(a) if a else None for a in acts] for r, acts in rows.items()
            }

    return Schedule()


def test_planned_order_keeps_a_complete_plan_and_drops_torchs_broken_1f1b_plan() -> None:
    good = _plan({1: ["", "1F0", "1B0", "1F1", "1B1"]})
    assert planned_order(good, 1, [1], 2) == ["1F0", "1B0", "1F1", "1B1"]
    zero_bubble = _plan({0: ["0F0", "0I0", "0W0", "0F1", "0I1", "0W1"]})
    assert planned_order(zero_bubble, 0, [0], 2) == ["0F0", "0I0", "0W0", "0F1", "0I1", "0W1"]
    # torch 2.13's Schedule1F1B plan for its last rank: forwards numbered from 1, F4 of 4
    broken = _plan({1: ["1F1", "1B0", "1F2", "1B1", "1F3", "1B2", "1F4", "1B3"]})
    assert planned_order(broken, 1, [1], 4) == []
    missing = _plan({0: ["0F0", "0B0", "0F1"]})
    assert planned_order(missing, 0, [0], 2) == []


def test_pipeline_and_tensor_parallel_blocks() -> None:
    base = {"train_micro_batch_size_per_gpu": 1}
    cfg = load_config(
        {**base, "pipeline": {"stages": "auto", "activation_checkpoint_interval": 2}},
        dp_world_size=1,
    )
    assert cfg.pipeline.schedule == "1f1b" and cfg.pipeline.activation_checkpoint_interval == 2
    assert cfg.tensor_parallel.size == 1
    with pytest.raises(ConfigError, match=r"pipeline\.schedul"):
        load_config({**base, "pipeline": {"schedul": "gpipe"}}, dp_world_size=1)
    with pytest.raises(ConfigError, match="partition_config must be an object"):
        load_config({**base, "tensor_parallel": {"partition_config": [1]}}, dp_world_size=1)


def test_layer_spec_accepts_modules_only() -> None:
    from zeroscope.engine.parallel.pipe import LayerSpec

    assert isinstance(LayerSpec(nn.Linear, 2, 3, bias=False).build(), nn.Linear)
    assert repr(LayerSpec(nn.Linear, 2, 3, bias=False)) == "Linear(2, 3, bias=False)"
    with pytest.raises(RuntimeError, match=r"only supports torch\.nn\.Module"):
        LayerSpec(torch.tanh)  # type: ignore[arg-type]


def _refusals(rank: int, world: int) -> list[str]:
    import zeroscope.engine.api as deepspeed
    from tests.pipeline_support import TP_PLAN, Block, Sleep, layer_specs
    from zeroscope.engine.parallel.pipe import PipelineError, PipelineModule

    def ds(stage: int, schedule: str = "1f1b", **extra: Any) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 2,
            "optimizer": {"type": "AdamW"},
            "zero_optimization": {"stage": stage},
            "pipeline": {"schedule": schedule},
            **extra,
        }

    out = []
    attempts = [
        (dict(virtual_stages=2, stage_placement="v"), ds(3, "zbv_zero_bubble")),
        (dict(), ds(1, "interleaved_1f1b")),
        (dict(virtual_stages=2), ds(1, "1f1b")),
        (dict(), ds(1, "nonesuch")),
    ]
    for kwargs, config in attempts:
        net = PipelineModule(layer_specs(), num_stages=2, loss_fn=nn.MSELoss(), **kwargs)
        try:
            deepspeed.initialize(model=net, config=config)
            out.append("accepted")
        except ConfigError as exc:
            out.append(str(exc))
    try:
        deepspeed.initialize(model=nn.Sequential(Block()), config=ds(3, tensor_parallel=TP_PLAN))
        out.append("accepted")
    except ConfigError as exc:
        out.append(str(exc))
    net = PipelineModule(layer_specs(), num_stages=2, loss_fn=nn.MSELoss())
    engine, *_ = deepspeed.initialize(model=net, config=ds(1))
    try:
        engine(torch.zeros(1, 8))
    except PipelineError as exc:
        out.append(str(exc))
    try:
        engine.save_checkpoint("never-written")
    except ConfigError as exc:
        out.append(str(exc))
    # profile: layer times 1,1,1,1,1,1,3,3 (x 20 ms) -> the only even cut is after six layers
    costs = [1, 1, 1, 1, 1, 1, 3, 3]
    net = PipelineModule(
        [Sleep(0.02 * c) for c in costs],
        num_stages=2,
        partition_method="profile",
        profile_input=torch.zeros(1, 8),
    )
    out.append(repr(net.parts))
    return out


def test_refusals_and_profile_partition() -> None:
    results = run_ranks(_refusals, 2, timeout=300)
    assert results[0] == results[1]
    zb, interleaved_v1, single_v2, unknown, tp_stage3, forward, checkpoint, parts = results[0]
    assert "weight gradients outside autograd" in zb and "stage 3" in zb
    assert "needs PipelineModule(virtual_stages>=2" in interleaved_v1
    assert "runs one stage per rank" in single_v2
    assert "pipeline.schedule 'nonesuch' is not one of" in unknown
    assert "ZeRO stage 3 with tensor parallelism is not supported" in tp_stage3
    assert forward == "Only train_batch() is accessible in pipeline mode."
    assert "checkpoints of pipeline- or tensor-parallel runs are not supported yet" in checkpoint
    assert parts == repr([0, 6, 8])
