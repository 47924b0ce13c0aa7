"""A run resumed from its checkpoint numbers its steps as the job does: DeepSpeed's
``load_checkpoint``, and the HF Trainer's ``resume_from_checkpoint`` over DDP.

A new user's trial resumed HelloDeepSpeed's BERT script from a checkpoint of step 20 and saw
its steps 21-24 shown as 1-4 (the agent counted this process's steps from 1): the TUI, the
trace and DeepSpeed's own log then disagree on every step. Oracle: DeepSpeed's own
``global_steps`` after each step, written by the unchanged script (tests/jobs/deepspeed_train.py)
in a run under plain torchrun that saves a checkpoint, then a run under ``zeroscope run`` that
loads it; the trace's step numbers, losses and Bye follow DeepSpeed's.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

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
from zeroscope.agent.schema import Bye, decode
from zeroscope.state import ClusterState
from zeroscope.state.prediction import predicted_memory

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

FIRST, THEN = 3, 2
CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    # A schedule that moves every step: the lr shown for a step is the one its update used.
    "scheduler": {
        "type": "WarmupLR",
        "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 10},
    },
}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ds-resume")
    (config,) = write_configs(tmp, {"zero2": CONFIG})
    ckpt = tmp / "ckpt"
    first = [
        "--configs",
        config,
        "--steps",
        str(FIRST),
        "--out",
        str(tmp / "a"),
        "--save",
        str(ckpt),
    ]
    run_plain(JOBS / "deepspeed_train.py", first, job_env(), 600)
    then = ["--configs", config, "--steps", str(THEN), "--out", str(tmp / "b"), "--load", str(ckpt)]
    run_zeroscope(JOBS / "deepspeed_train.py", then, job_env(), tmp / "t.zstrace", 600)
    return {
        "own": [out[config] for out in read_outputs(tmp / "b")],
        "trace": read_trace(tmp / "t.zstrace"),
        "path": tmp / "t.zstrace",
    }


def test_the_steps_carry_deepspeeds_global_steps(resumed: dict) -> None:
    for rank in range(2):
        own = resumed["own"][rank]
        assert own["global_steps"] == list(range(FIRST + 1, FIRST + THEN + 1))  # the oracle
        steps = resumed["trace"][rank].steps
        assert [s.step for s in steps] == own["global_steps"]
        assert [s.loss for s in steps] == [float.fromhex(h) for h in own["losses"]]
        assert [s.lr for s in steps] == own["lr"] and len(set(own["lr"])) == THEN
        # fp32 ZeRO-2: DeepSpeed clones its fp32 partition for the optimizer, so O is 12 bytes
        # a parameter over N, as the prediction now says (it read 8: +50 %, flagged red).
        (hello,) = resumed["trace"][rank].hellos
        state = ClusterState()
        state.ingest(hello)
        m, basis = predicted_memory(state)
        assert m is not None and "fp32 copy" in basis
        assert m.optim == 12 * hello.params.total / 2
        assert steps[-1].memory.optim == pytest.approx(m.optim, rel=0.01)  # padding apart


def test_the_bye_says_the_last_step_by_deepspeeds_count(resumed: dict) -> None:
    with sqlite3.connect(resumed["path"]) as conn:
        rows = conn.execute("SELECT payload FROM messages WHERE kind = 'bye'").fetchall()
    byes = [m for m in (decode(p) for (p,) in rows) if isinstance(m, Bye)]
    assert sorted(b.rank for b in byes) == [0, 1]
    assert {b.step for b in byes} == {FIRST + THEN}


def test_an_hf_trainer_resumed_over_ddp_numbers_its_steps_by_its_global_step(
    tmp_path: Path,
) -> None:
    """The Trainer loads its state (``global_step``) before ``on_train_begin``; its steps then
    go on from it. Oracle: the Trainer's own ``state.global_step`` at each step's end."""
    script = JOBS / "hf_resume_train.py"
    common = ["--out", str(tmp_path / "own"), "--workdir", str(tmp_path / "work")]
    run_plain(script, ["--steps", str(FIRST), *common], job_env(), 600)
    trace = tmp_path / "t.zstrace"
    run_zeroscope(
        script, ["--steps", str(FIRST + THEN), "--resume", *common], job_env(), trace, 600
    )
    own = read_outputs(tmp_path / "own")
    steps = read_trace(trace)
    # The Trainer's batch and clipping in the Hello (DDP itself knows neither): 2 per device,
    # no accumulation, 2 ranks, max_grad_norm's default 1.0.
    for rank in range(2):
        (hello,) = steps[rank].hellos
        c = hello.config
        assert (c.micro_batch_size, c.gradient_accumulation_steps) == (2, 1)
        assert (c.train_batch_size, c.gradient_clipping) == (4, 1.0)
    for rank in range(2):
        assert own[rank]["global_steps"] == list(range(FIRST + 1, FIRST + THEN + 1))
        assert [s.step for s in steps[rank].steps] == own[rank]["global_steps"]
        # The lr of each step as the Trainer logs it (its linear decay moves every step): the
        # one the update used, read before the Trainer moves its scheduler on.
        lrs = [s.lr for s in steps[rank].steps]
        assert lrs == pytest.approx(own[rank]["lr"], rel=1e-12) and len(set(lrs)) == THEN
