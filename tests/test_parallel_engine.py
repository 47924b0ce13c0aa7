"""3D parallelism against one-process training (tests/pipeline_support.py).

One launch of 4 gloo ranks runs every dp x pp and dp x tp case (ZeRO 0-3 under 1F1B at pp2 x dp2
and pp4 x dp1, tied weights across stages, interleaved and zero-bubble schedules; tensor
parallel at ZeRO 1 and 2), one launch of 2 ranks pp2 x dp1 at ZeRO 0-3, one launch of 8 ranks
the dp2 x pp2 x tp2 cases and pp4 x dp2 at ZeRO 0-3 (about 6 s more in that launch on a loaded
2-core machine: the launch's start-up is paid once). The pp4 cases cut the layers by
``partition_method="parameters"`` (a uniform cut of 6 layers in 4 leaves a stage with only a
lambda). Each case's loss trajectory must equal the
reference's at fp32 (5e-6: float32 vs the reference's float64 loss sum), and the engine's
global gradient norm must equal ``clip_grad_norm_``'s (1e-5 relative) — the norm is over the
whole model, so it checks that every stage's and every tensor shard's gradients were counted,
and the replicated / tied ones exactly once; clipping at 1.0 is active in these runs (norms
above 1), so a wrong norm would also change the losses.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.distributed import run_ranks
from tests.pipeline_support import (
    Case,
    reference_llama,
    reference_run,
    run_case,
    run_llama,
    run_mpu,
)

CASES_4 = [
    Case("pp2-dp2-zero0", stage=0),
    Case("pp2-dp2-zero1", stage=1),
    Case("pp2-dp2-zero2", stage=2),
    Case("pp2-dp2-zero3", stage=3),
    Case("pp2-dp2-zero2-tied", stage=2, tied=True),
    Case("pp2-dp2-zero3-tied", stage=3, tied=True),
    Case("pp2-dp2-zero3-gpipe", stage=3, schedule="gpipe"),
    Case(
        "pp2-dp2-zero3-offload",
        stage=3,
        extra={
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "offload_optimizer": {"device": "cpu", "pin_memory": False},
            }
        },
    ),
    Case("pp2-dp2-zero1-interleaved", stage=1, schedule="interleaved_1f1b", virtual=2),
    Case("pp2-dp2-zero2-zbv", stage=2, schedule="zbv_zero_bubble", virtual=2, placement="v"),
    Case("tp2-dp2-zero1", pp=1, tp=2, stage=1),
    Case("tp2-dp2-zero2", pp=1, tp=2, stage=2),
    *(Case(f"pp4-dp1-zero{s}", pp=4, stage=s, partition="parameters") for s in range(4)),
    Case("pp4-dp1-zero3-tied", pp=4, stage=3, tied=True, partition="parameters"),
]
CASES_2 = [Case(f"pp2-dp1-zero{s}", stage=s) for s in range(4)]
CASES_8 = [
    Case("pp2-tp2-dp2-zero1", tp=2, stage=1),
    Case("pp2-tp2-dp2-zero2-tied", tp=2, stage=2, tied=True),
    *(Case(f"pp4-dp2-zero{s}", pp=4, stage=s, partition="parameters") for s in range(4)),
]


def train_all(rank: int, world: int, cases: list[Case]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {case.name: run_case(case, world) for case in cases}
    if world == 4:
        out["hf-llama-tp2"] = run_llama(world)
        out["mpu-tp2-dp2"] = run_mpu(world)
    return out


@pytest.fixture(scope="module")
def world4() -> list[dict[str, dict[str, list[float]]]]:
    return run_ranks(train_all, 4, CASES_4, timeout=900)


@pytest.fixture(scope="module")
def world8() -> list[dict[str, dict[str, list[float]]]]:
    return run_ranks(train_all, 8, CASES_8, timeout=900)


@pytest.fixture(scope="module")
def world2() -> list[dict[str, dict[str, list[float]]]]:
    return run_ranks(train_all, 2, CASES_2, timeout=900)


def _check(case: Case, ranks: list[dict[str, dict[str, list[float]]]], world: int) -> None:
    expected = reference_run(case, world)
    for rank, got in enumerate(ranks):
        result = got[case.name]
        assert result["losses"] == pytest.approx(expected["losses"], abs=5e-6), (
            f"rank {rank}: {result['losses']} vs one process {expected['losses']}"
        )
        assert result["norms"] == pytest.approx(expected["norms"], rel=1e-5), f"rank {rank}"
    assert max(expected["norms"]) > 1.0, "clipping was not active: the norm check is weaker"


@pytest.mark.parametrize("case", CASES_4, ids=lambda c: c.name)
def test_four_ranks_match_one_process(case: Case, world4: list) -> None:
    _check(case, world4, 4)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_8, ids=lambda c: c.name)
def test_eight_ranks_match_one_process(case: Case, world8: list) -> None:
    _check(case, world8, 8)


@pytest.mark.parametrize("case", CASES_2, ids=lambda c: c.name)
def test_two_ranks_pp2_dp1_match_one_process(case: Case, world2: list) -> None:
    _check(case, world2, 2)


def test_hugging_face_llama_tensor_parallel_by_its_own_plan(world4: list) -> None:
    """A model nobody here wrote: LlamaForCausalLM's own tp plan (vocabulary-sharded
    embedding, column/row attention and MLP, gathered lm_head), dp2 x tp2 at ZeRO-2."""
    expected = reference_llama(4)
    for ranks in world4:
        assert ranks["hf-llama-tp2"]["losses"] == pytest.approx(expected, abs=5e-6)


@pytest.mark.parametrize("name", ["tp2-dp2-zero1", "tp2-dp2-zero2"])
def test_tensor_parallel_all_reduces_are_reported(name: str, world4: list) -> None:
    """Megatron's f/g pair: per block and micro-batch, one all-reduce of the row-parallel
    output in forward and one of the column-parallel input gradient in backward, except for the
    first block, whose input (the data) needs no gradient: (4 + 3) x 4 micro-batches = 28 per
    step, each reported with label "tp"."""
    for ranks in world4:
        assert ranks[name]["tp"] == [{"all_reduce": 28}] * 3


def test_deepspeeds_mpu_argument_with_the_users_own_tensor_parallelism(world4: list) -> None:
    """``initialize(mpu=...)``: ZeRO over mpu's data-parallel group and the gradient norm over
    its model-parallel group, on a model the user parallelized themselves."""
    expected = reference_run(Case("mpu", pp=1, tp=2, stage=2), 4)
    for ranks in world4:
        assert ranks["mpu-tp2-dp2"]["losses"] == pytest.approx(expected["losses"], abs=5e-6)
        assert ranks["mpu-tp2-dp2"]["norms"] == pytest.approx(expected["norms"], rel=1e-5)


@pytest.mark.parametrize("case", [c for c in CASES_4 if c.pp > 1], ids=lambda c: c.name)
def test_the_schedule_ran_its_own_plan(case: Case, world4: list) -> None:
    """Where torch's ``pipeline_order`` is a complete plan for the rank (GPipe, interleaved and
    zero-bubble schedules on every rank, 1F1B on all but the last stage), the stage methods the
    engine timed ran exactly that order of (stage, F/B/I/W, micro-batch)."""
    planned = 0
    for ranks in world4:
        got = ranks[case.name]
        if got["plan"]:
            planned += 1
            assert got["executed"] == got["plan"]
        else:
            assert len(got["executed"]) == 2 * case.gas * case.virtual  # F and B of each
    # torch 2.13's Schedule1F1B plans its last stage wrongly (docs/parallel.md): those ranks,
    # one per data-parallel replica, have no plan
    assert planned == (4 - 4 // case.pp if case.schedule == "1f1b" else 4)
