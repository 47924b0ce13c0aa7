"""DeepSpeed's pipeline engine under the attach: ``PipelineModule`` trained with
``engine.train_batch()`` (DeepSpeed's pipeline tutorial, as Megatron-DeepSpeed trains).

``train_batch()`` runs a whole step, its optimizer through the schedule's own instruction, never
``engine.step()``, where the attach ended DeepSpeed's steps: such a job reported no step at all
("2 ranks reported, no step completed"). The oracle is the script (tests/scripts/pipe_tutorial.py:
two stages on two gloo ranks, ZeRO-0, fp32, AdamW, four micro-batches of 2 a step): the losses
``train_batch()`` returned, which must also be bitwise those of bare torchrun; and Adam's state,
two fp32 moments per parameter element.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.attach_support import job_env, read_trace, run_job, run_zeroscope

SCRIPT = Path(__file__).parent / "scripts" / "pipe_tutorial.py"
STEPS = 4
SAMPLES = 8
"""The script's train_batch_size: 2 per micro-batch x 4 micro-batches, one data-parallel replica."""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_pipeline_engines_steps_are_its_train_batches(tmp_path: Path) -> None:
    env = job_env()
    args = ["--steps", str(STEPS)]
    plain = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT)]
    done = run_job([*plain, *args, "--out", str(tmp_path / "plain.json")], env, 600)
    assert done.returncode == 0, done.stderr[-4000:]
    run_zeroscope(
        SCRIPT, [*args, "--out", str(tmp_path / "zs.json")], env, tmp_path / "t.zstrace", 600
    )
    job = json.loads((tmp_path / "zs.json").read_text())
    assert job["losses"] == json.loads((tmp_path / "plain.json").read_text())["losses"]  # bitwise
    trace = read_trace(tmp_path / "t.zstrace")
    for rank in range(2):
        steps = trace[rank].steps
        assert [s.step for s in steps] == list(range(1, STEPS + 1))  # eval_batch() is no step
        for report, loss in zip(steps, job["losses"], strict=True):
            # train_batch()'s own loss on every stage (DeepSpeed broadcasts it from the last).
            assert report.loss == pytest.approx(loss, rel=1e-6)
            # The replica's samples once, on its first stage.
            assert report.samples == (SAMPLES if rank == 0 else 0)
            p = report.phases
            assert p.forward and p.backward and p.optimizer, (rank, report.step, p)
            m = report.memory
            assert m.params and m.grads == m.params  # ZeRO-0: whole fp32 gradients
            # AdamW's exp_avg and exp_avg_sq, fp32, beside a 4-byte step per parameter tensor.
            assert 2 * m.params <= m.optim < 2 * m.params + 4 * 64, m
    assert trace[0].hellos[-1].engine == "deepspeed"
