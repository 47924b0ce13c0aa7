"""Real DeepSpeed 0.19.8 at ZeRO-1 in bf16 with fp32 gradient accumulation (``"data_types":
{"grad_accum_dtype": "fp32"}``, the setting DeepSpeed recommends for bf16 with many
accumulation steps) under ``zeroscope run``, script unchanged (tests/jobs/deepspeed_train.py).

DeepSpeed builds its ``BF16_Optimizer`` for it, not the ZeRO-1/2 optimizer, with a layout of its
own: the parameters are views of flat bf16 groups, gradients accumulate into whole fp32 flat
buffers beside the bf16 ones autograd leaves on the parameters, and each rank steps an fp32
master partition. Before, the reader looked for ZeRO-1/2's names, found none, showed P/G/O as NA
and said the names were "gone", as if DeepSpeed had drifted. Oracles: DeepSpeed's own layout as
a formula over the script's parameter groups, its losses (the same script under bare torchrun),
and the prediction the Memory screen shows beside the measured bytes. The same optimizer runs
DeepSpeed's bf16 pipeline stages at ZeRO-0 (tests/scripts/pipe_tutorial.py ``--bf16``),
accumulating in bf16 there."""

from __future__ import annotations

import math

import pytest

from tests.attach_support import (
    JOBS,
    job_env,
    read_outputs,
    read_trace,
    run_plain,
    run_zeroscope,
    write_configs,
)
from zeroscope.state import ClusterState
from zeroscope.state.prediction import predicted_memory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = JOBS / "deepspeed_train.py"
N, STEPS, MICRO = 2, 3, 2
CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": MICRO,
    "zero_optimization": {"stage": 1},
    "bf16": {"enabled": True},
    "data_types": {"grad_accum_dtype": "fp32"},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ds-bf16-accum")
    (path,) = write_configs(tmp, {"bf16-fp32-accum": CONFIG})
    env = job_env()
    args = ["--configs", path, "--steps", str(STEPS)]
    run_plain(SCRIPT, [*args, "--out", str(tmp / "plain")], env, timeout=600)
    done = run_zeroscope(SCRIPT, [*args, "--out", str(tmp / "zs")], env, tmp / "t.zstrace", 600)
    return {
        "plain": [out[path] for out in read_outputs(tmp / "plain")],
        "zs": [out[path] for out in read_outputs(tmp / "zs")],
        "trace": read_trace(tmp / "t.zstrace"),
        "said": done.stdout + done.stderr,
    }


def bf16_optimizer(groups: list[list[int]]) -> dict[str, int]:
    """bf16_optimizer.py: each group one flat bf16 buffer padded to a multiple of 2N (the
    parameters view it), a whole fp32 accumulation buffer the same size, the bf16 gradient of
    each parameter, and on each rank the fp32 master of its 1/N with AdamW's m and v (and a
    4-byte step tensor)."""
    out = {"params": 0, "grads": 0, "optim": 0}
    for sizes in groups:
        padded = math.ceil(sum(sizes) / (2 * N)) * 2 * N
        out["params"] += 2 * padded
        out["grads"] += 4 * padded + 2 * sum(sizes)
        out["optim"] += 12 * (padded // N) + 4
    return out


def test_losses_are_bit_identical_and_each_step_is_deepspeeds(runs: dict) -> None:
    for rank in range(N):
        assert runs["zs"][rank]["losses"] == runs["plain"][rank]["losses"]
        micro = [float.fromhex(h) for h in runs["plain"][rank]["losses"]]
        means = [sum(micro[i : i + MICRO]) / MICRO for i in range(0, len(micro), MICRO)]
        steps = runs["trace"][rank].steps
        assert [s.loss for s in steps] == means
        assert [s.step for s in steps] == list(range(1, STEPS + 1))


def test_memory_equals_the_bf16_optimizers_layout(runs: dict) -> None:
    for rank in range(N):
        expected = bf16_optimizer(runs["zs"][rank]["groups"])
        for step in runs["trace"][rank].steps:
            m = step.memory
            assert {"params": m.params, "grads": m.grads, "optim": m.optim} == expected
            assert (m.host_params, m.host_grads, m.host_optim) == (0, 0, 0)
    assert "not seen" not in runs["said"]  # no part of the attach turned itself off


def test_the_prediction_holds_the_fp32_accumulation_buffers_and_says_so(runs: dict) -> None:
    hello = runs["trace"][0].hellos[0]
    assert (hello.config.stage, hello.config.precision) == (1, "bf16")
    assert hello.config.grad_accum_bytes == 4
    state = ClusterState()
    state.ingest(hello)
    predicted, basis = predicted_memory(state)
    assert predicted is not None
    measured = runs["trace"][0].steps[-1].memory
    assert predicted.grads == measured.grads  # 4 bytes a padded parameter + the bf16 grads
    assert "4-byte gradient accumulation" in basis


# -- bf16 pipeline stages (ZeRO-0): the same optimizer, accumulating in bf16 ----------------------

PIPE = JOBS.parent / "scripts" / "pipe_tutorial.py"
STAGE_PARAMS = (12 * 32 + 32 + 32 * 32 + 32, 32 * 16 + 16 + 16 * 5 + 5)
"""The tutorial's two stages (``partition_method="parameters"``: its layers 0-3 and 4-6)."""


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ds-bf16-pipe")
    args = ["--bf16", "--steps", "2", "--out", str(tmp / "out.json")]
    run_zeroscope(PIPE, args, job_env(), tmp / "t.zstrace", 600)
    return read_trace(tmp / "t.zstrace")


def test_bf16_pipeline_stages_are_counted_from_the_bf16_optimizer(pipe: dict) -> None:
    """One rank a stage (data parallel 1): its flat bf16 group padded to even, a bf16
    accumulation buffer the same size (the model's dtype: no ``grad_accum_dtype`` set) beside
    the bf16 gradients, the fp32 master with AdamW's m and v and a step tensor."""
    for rank, psi in enumerate(STAGE_PARAMS):
        padded = math.ceil(psi / 2) * 2
        hello = pipe[rank].hellos[-1]
        assert hello.config.grad_accum_bytes == 2
        expected = {"params": 2 * padded, "grads": 2 * padded + 2 * psi, "optim": 12 * padded + 4}
        for step in pipe[rank].steps:
            m = step.memory
            assert {"params": m.params, "grads": m.grads, "optim": m.optim} == expected, rank
        state = ClusterState()
        state.ingest(hello)
        predicted, _ = predicted_memory(state)
        assert predicted is not None and predicted.grads == expected["grads"]
