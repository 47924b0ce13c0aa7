"""A ``torch.distributed.pipelining`` job's loss under the attach.

The schedule computes each micro-batch's loss on the last stage and backpropagates with
``torch.autograd.backward``: no ``Tensor.backward`` carried the loss, and such a job read "loss
NA" on every step. The oracle is the job (tests/jobs/pipeline_train.py): the mean of the
micro-batch losses the schedule hands back, as the script reads it; its losses are compared
bitwise with bare torchrun's.

Each rank's stage is in its Hello (agent/attach/pipeline_layout.py), from the schedule's own
stage; without it the viewer judged the two stages against each other as if they were
replicas and named one a straggler, and its final line read the last stage's loss as a fault
("r1 only: 1 of 2 ranks").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import JOBS, plain_and_watched
from zeroscope.state import ClusterState
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.store.trace import TraceReader

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

    # The stages, as the script built them: stage r on rank r, one pipeline of two stages and
    # four micro-batches (tests/jobs/pipeline_train.py).
    for rank in range(2):
        layout = trace[rank].hellos[-1].parallel
        assert layout is not None
        assert (layout.pp, layout.pp_size, layout.stages) == (rank, 2, [rank])
        assert (layout.dp, layout.dp_size, layout.tp_size) == (0, 1, 1)
        assert (layout.num_stages, layout.microbatches) == (2, 4)
    state = ClusterState()
    with TraceReader(tmp_path / "t.zstrace") as reader:
        for message in [*reader.hellos(), *reader.messages()]:  # as a replay reads them
            state.ingest(message)
    state.flush()
    closed = state.complete_steps()
    assert [a.step for a in closed] == list(range(1, STEPS + 1))
    # Each stage is its own group of peers (one replica): no rank is set against the other
    # stage, so none is a straggler; the loss is the last stage's, said so.
    assert all(a.standings == {} for a in closed)
    # ... nor named the slowest by its step time (stages compute different layers).
    assert all(a.slowest_rank is None and "slowest NA" in step_line(a) for a in closed)
    assert not [f for f in state.lags.findings() if f.kind == "straggler"]
    assert "(last pipeline stage: r1)" in summary_lines(state)[1]
