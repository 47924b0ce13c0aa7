"""Real DeepSpeed 0.19.8 at ZeRO stage 0 with fp16 and with bf16 (DeepSpeedExamples' CIFAR
script's default is fp16 at stage 0) under ``zeroscope run``, script unchanged.

DeepSpeed's fp16 and bf16 optimizers make their optimizer state while the engine is built, by
calling the wrapped torch optimizer's ``step()`` on zero gradients. The attach's plain-loop
optimizer hooks took that for the job's first training step: every run reported one step more
than it trained, numbered one ahead of DeepSpeed's ``global_steps``, and the bogus step (the
weight broadcasts of the engine's construction, no loss) set the run's peak memory. Oracle:
DeepSpeed's own counters written by the script after each step (tests/jobs/deepspeed_train.py):
its ``global_steps`` and the exact loss of each step.
"""

from __future__ import annotations

import pytest

from tests.attach_support import (
    FP16_ON_CPU,
    JOBS,
    job_env,
    read_outputs,
    read_trace,
    run_zeroscope,
    segments,
    write_configs,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 3
ADAM = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
CONFIGS: dict[str, dict] = {
    "fp16": {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 0},
        "fp16": {"enabled": True, "initial_scale_power": 8},
        "optimizer": ADAM,
    },
    "bf16": {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": {"stage": 0},
        "bf16": {"enabled": True},
        "optimizer": ADAM,
    },
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ds-stage0")
    paths = write_configs(tmp, CONFIGS)
    args = ["--configs", ",".join(paths), "--steps", str(STEPS), "--out", str(tmp / "zs")]
    run_zeroscope(JOBS / "deepspeed_train.py", args, job_env(FP16_ON_CPU), tmp / "t.zstrace", 800)
    own = read_outputs(tmp / "zs")
    return {
        "own": [{n: out[path] for n, path in zip(CONFIGS, paths)} for out in own],
        "trace": read_trace(tmp / "t.zstrace"),
    }


def test_the_steps_are_deepspeeds_optimizer_steps_and_no_more(runs: dict) -> None:
    for rank in range(2):
        # segments() asserts the trace's steps are 1..n, n the steps the script trained.
        parts = segments(runs["trace"][rank].steps, [STEPS] * len(CONFIGS))
        for name, steps in zip(CONFIGS, parts):
            own = runs["own"][rank][name]
            assert own["global_steps"] == list(range(1, STEPS + 1))
            assert [s.loss for s in steps] == [float.fromhex(h) for h in own["losses"]], name
            assert all(s.collectives for s in steps), name


def test_the_peak_is_a_training_steps_memory(runs: dict) -> None:
    """Stage 0 holds the same P, G and O at every step: no step reports more (the engine's
    construction, counted as a step, reported P and G with both copies of the weights)."""
    for rank in range(2):
        parts = segments(runs["trace"][rank].steps, [STEPS] * len(CONFIGS))
        for name, steps in zip(CONFIGS, parts):
            psi = sum(sum(g) for g in runs["own"][rank][name]["groups"])
            assert {s.memory.params for s in steps} == {2 * psi}, name
