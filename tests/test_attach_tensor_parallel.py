"""Tensor parallelism under the attach: DTensor's functional collectives are recorded.

DTensor redistributes through functional collectives, which call the group's backend from C++
and pass through no ``ProcessGroup`` method the attach wraps: a tensor-parallel job showed no
collective at all in its steps ("exposed NA", an empty Comm screen). They are now read from
torch's Flight Recorder, every group of every ``DeviceMesh`` watched (agent/attach/device_mesh.py).

The oracle is the job itself (tests/jobs/tensor_parallel_train.py): torch's own
``CommDebugMode`` counts the functional collectives of each step, and the job knows the shape
they reduce; its losses are compared bitwise with bare torchrun. The job's own ``dist.all_reduce``
of the loss goes through a wrapped method on the same group: it must be counted once, not once
by the wrapper and again from the recorder.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import JOBS, plain_and_watched
from zeroscope.state import ClusterState
from zeroscope.state.prediction import predicted_traffic
from zeroscope.state.viewmodel import comm_view

SCRIPT = JOBS / "tensor_parallel_train.py"
STEPS = 4
FLOAT32 = 4


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_functional_collective_of_a_tensor_parallel_job_is_read_once(
    tmp_path: Path,
) -> None:
    trace, alone, under = plain_and_watched(SCRIPT, STEPS, tmp_path)
    state = ClusterState()
    for rank in range(2):
        # The model is split over both ranks, not replicated: no gradient is averaged between
        # them, so no data-parallel traffic is predicted (the Comm screen had held the
        # tensor-parallel all-reduces against a gradient all-reduce of the whole model).
        hello = trace[rank].hellos[-1]
        assert hello.config.dp_world_size == 1 and hello.world_size == 2
        state.ingest(hello)
        plain, watched = alone[rank], under[rank]
        assert [s["loss"] for s in watched] == [s["loss"] for s in plain]  # bitwise
        steps = trace[rank].steps
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        for report, job in zip(steps, watched, strict=True):
            reduces = [c for c in report.collectives if c.op == "all_reduce"]
            batch, width = job["shape"]
            functional = [c for c in reduces if c.nbytes == batch * width * FLOAT32]
            assert len(functional) == job["functional"] == 3, report.step
            # Read from the recorder, labelled by the mesh dimension; gloo's entries carry no
            # completion time: bytes and counts exact, duration NA (never a host enqueue gap).
            assert {c.label for c in functional} == {"tp"}
            assert {c.clock for c in functional} == {"none"}
            assert {c.group_size for c in functional} == {2}
            # The loss average of the iteration before (issued after its optimizer step, so at
            # the start of this one): recorded by the wrapper, once, on the host clock.
            own = [c for c in reduces if c.nbytes == FLOAT32]
            assert len(own) == (0 if report.step == 1 else 1), report.step
            assert {c.clock for c in own} <= {"host"}
            assert len(reduces) == len(functional) + len(own)
            assert [c.start_s for c in report.collectives] == sorted(
                c.start_s for c in report.collectives
            )  # one list in issue order, the recorder's among the wrappers'
            state.ingest(report)
    state.flush()
    expected = predicted_traffic(state)
    assert expected is not None and expected.volume == 0 and expected.paper == 0
    assert comm_view(state, ()).ratio is None
