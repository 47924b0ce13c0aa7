"""A ``torch.distributed.pipelining`` job's loss under the attach.

The schedule computes each micro-batch's loss on the last stage and backpropagates with
``torch.autograd.backward``: no ``Tensor.backward`` carried the loss, and such a job read "loss
NA" on every step. The oracle is the job (tests/jobs/pipeline_train.py): the mean of the
micro-batch losses the schedule hands back, as the script reads it; its losses are compared
bitwise with bare torchrun's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import JOBS, plain_and_watched

SCRIPT = JOBS / "pipeline_train.py"
STEPS = 4


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_pipeline_schedules_loss_is_the_mean_of_its_micro_batches(tmp_path: Path) -> None:
    trace, alone, under = plain_and_watched(SCRIPT, STEPS, tmp_path)
    for rank in range(2):
        watched = under[rank]
        assert watched == alone[rank]  # bitwise: the attach changed nothing the job computes
        steps = trace[rank].steps
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        for report, job in zip(steps, watched, strict=True):
            if job["loss"] is None:  # the first stage computes no loss
                assert report.loss is None
            else:
                assert report.loss == pytest.approx(float.fromhex(job["loss"]), rel=1e-6)
            assert any(c.op == "p2p" for c in report.collectives)  # the stages' sends
    assert all(s.loss is not None for s in trace[1].steps)
