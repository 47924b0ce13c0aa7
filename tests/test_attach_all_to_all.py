"""All-to-all under the attach: an expert-parallel layer's token routing is recorded.

A mixture-of-experts job spends its communication in all-to-all (tokens to the rank holding
their expert, and back); zeroscope recorded none of it, so such a job's comm time and exposed
share were the gradient all-reduces' alone. The oracle is the job itself
(tests/jobs/expert_parallel_train.py): it writes the bytes of every all-to-all it issued (the
ranks send different amounts) and its losses, run once under ``zeroscope run`` and once under
bare torchrun.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import JOBS, plain_and_watched
from zeroscope.agent.schema import Collective, StepReport
from zeroscope.state import ClusterState
from zeroscope.state.bandwidth import bus_factor
from zeroscope.state.history import model_volume
from zeroscope.state.viewmodel import comm_view

SCRIPT = JOBS / "expert_parallel_train.py"
STEPS = 5


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_all_to_all_is_recorded_with_the_bytes_the_job_sent(tmp_path: Path) -> None:
    trace, alone, under = plain_and_watched(SCRIPT, STEPS, tmp_path)
    state = ClusterState()
    for rank in range(2):
        plain, watched = alone[rank], under[rank]
        assert [s["loss"] for s in watched] == [s["loss"] for s in plain]  # bitwise
        steps = trace[rank].steps
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        for report, job in zip(steps, watched, strict=True):
            a2a = [c for c in report.collectives if c.op == "all_to_all"]
            assert [c.nbytes for c in a2a] == job["all_to_all"], report.step
            assert {c.group_size for c in a2a} == {2}
            # gloo's all-to-all is synchronous: the host saw each end
            assert {c.clock for c in a2a} == {"host"}
            assert all(c.duration_s > 0 for c in a2a)
            # the gradient all-reduces beside them, one a parameter
            assert sum(c.op == "all_reduce" for c in report.collectives) == 4
            state.ingest(report)
    # The views count them: bytes per op, nccl-tests' (n-1)/n bus factor.
    state.flush()
    summary = state.ranks[0].summary
    assert summary is not None
    op = summary.ops["all_to_all"]
    last = trace[0].steps[-1]
    assert op.nbytes == sum(c.nbytes for c in last.collectives if c.op == "all_to_all")
    assert op.bus_bytes == pytest.approx(op.nbytes * bus_factor("all_to_all", 2))
    assert bus_factor("all_to_all", 2) == 0.5


def _report(rank: int, step: int, ops: list[tuple[str, int]]) -> StepReport:
    collectives = [
        Collective(op=op, nbytes=n, group_size=2, start_s=0.0, duration_s=0.001, exposed_s=0.0)
        for op, n in ops
    ]
    return StepReport(rank=rank, step=step, wall_ns=step, duration_s=0.1, collectives=collectives)


def test_the_traffic_model_is_held_against_the_volume_it_models() -> None:
    """An expert layer's all-to-all routes activations (sized by the batch), which the engine's
    traffic model (parameters and gradients) does not hold: the comparison leaves it out and
    says how much it was, where it had read the sum as the engine's traffic (2.14x on a
    DeepSpeed MoE job whose all-reduces met the model exactly)."""
    state = ClusterState()
    for step in (1, 2):
        for rank in (0, 1):
            state.ingest(_report(rank, step, [("all_reduce", 1000), ("all_to_all", 600)]))
    summary = state.ranks[0].summary
    assert summary is not None
    assert summary.comm_volume == 2 * 1000 + 600  # an all-reduce counts twice (ZeRO paper)
    assert model_volume(summary) == 2000
    view = comm_view(state, ["all_reduce", "all_to_all"])
    assert view.last_volume == 2600
    assert view.outside_model == {"all_to_all": 600}
    plain = ClusterState()
    for rank in (0, 1):
        plain.ingest(_report(rank, 1, [("all_reduce", 1000)]))
    assert comm_view(plain, ["all_reduce"]).outside_model == {}
