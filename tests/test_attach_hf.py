"""A Hugging Face ``Trainer`` with ``TrainingArguments(deepspeed=...)`` under ``zeroscope run``,
script unchanged (tests/jobs/hf_trainer_train.py: a tiny GPT-2 built from a config, ZeRO-2,
bf16, 2 accumulation steps). Oracles: the same script under bare torchrun (the Trainer's logged
losses, bit for bit), the Trainer's own log and DeepSpeed's counters and grouping (written by
the script), and DeepSpeed's ZeRO-2 layout as a formula."""

from __future__ import annotations

import json
import math

import pytest

from tests.attach_support import (
    JOBS,
    assert_clocks_honest,
    job_env,
    read_outputs,
    read_trace,
    run_plain,
    run_zeroscope,
)
from tests.test_attach_deepspeed import stage12

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SCRIPT = JOBS / "hf_trainer_train.py"
N = 2
STEPS = 3
GAS = 2
DS_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": GAS,
    "zero_optimization": {"stage": 2},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
    "gradient_clipping": 1.0,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("hf-attach")
    config = tmp / "ds.json"
    config.write_text(json.dumps(DS_CONFIG))
    env = job_env()
    args = ["--ds-config", str(config), "--steps", str(STEPS), "--workdir", str(tmp / "w")]
    run_plain(SCRIPT, [*args, "--out", str(tmp / "plain")], env, timeout=900)
    done = run_zeroscope(SCRIPT, [*args, "--out", str(tmp / "zs")], env, tmp / "t.zstrace", 900)
    return {
        "plain": read_outputs(tmp / "plain"),
        "zs": read_outputs(tmp / "zs"),
        "trace": read_trace(tmp / "t.zstrace"),
        "stdout": done.stdout,
    }


def test_the_trainers_losses_are_bit_identical_with_and_without_zeroscope(runs: dict) -> None:
    for rank in range(N):
        assert runs["zs"][rank]["losses"] == runs["plain"][rank]["losses"]
        assert len(runs["zs"][rank]["losses"]) == STEPS
    # The Trainer logs the mean over ranks of each rank's loss; the trace has each rank's own.
    per_rank = [[s.loss for s in runs["trace"][r].steps] for r in range(N)]
    for step, logged in enumerate(runs["plain"][0]["losses"]):
        assert sum(losses[step] for losses in per_rank) / N == pytest.approx(logged, rel=1e-6)


def test_the_header_says_trainer_on_deepspeed(runs: dict) -> None:
    for rank in range(N):
        (hello,) = runs["trace"][rank].hellos
        assert hello.engine == "hf-trainer+deepspeed"
        c = hello.config
        assert (c.stage, c.precision, c.gradient_accumulation_steps) == (2, "bf16", GAS)
        assert c.micro_batch_size == 2 and c.gradient_clipping == 1.0
    assert "(hf-trainer+deepspeed)" in runs["stdout"]


def test_one_report_per_optimizer_step_with_deepspeeds_counters(runs: dict) -> None:
    for rank in range(N):
        steps = runs["trace"][rank].steps
        own = runs["zs"][rank]
        assert [s.step for s in steps] == list(range(1, own["global_steps"] + 1))
        assert sum(s.skipped for s in steps) == own["skipped_steps"] == 0
        assert all(s.samples == 2 * GAS and s.grad_norm is not None for s in steps)
        assert all(s.loss_scale is None for s in steps)  # bf16: no loss scaler


def test_memory_and_traffic_follow_zero2(runs: dict) -> None:
    for rank in range(N):
        groups = runs["zs"][rank]["groups"]  # DeepSpeed's grouping (decay / no decay)
        psi = sum(sum(g) for g in groups)
        padded = sum(math.ceil(sum(g) / (2 * N)) * 2 * N for g in groups)
        expected = stage12(groups, rank, 2, stage=2)
        for step in runs["trace"][rank].steps:
            m = step.memory
            assert {"params": m.params, "grads": m.grads, "optim": m.optim} == expected
            reduced = [c.nbytes for c in step.collectives if c.op == "all_reduce" and c.nbytes > 8]
            assert reduced == [2 * psi] * GAS  # ZeRO-2 reduces at every micro-batch
            gathered = [
                c.nbytes for c in step.collectives if c.op == "all_gather" and c.nbytes > 64
            ]
            assert gathered == [2 * padded]  # the updated bf16 parameters, once per step
            assert_clocks_honest(step)
