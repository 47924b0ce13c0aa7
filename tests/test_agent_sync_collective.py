"""A synchronous collective handed to the agent (``tel.collective(None, ...)``: what
``dist.all_reduce(t)`` returns without ``async_op=True``) is recorded and never raises.

Before, ``None`` could not be weakly referenced, went to the fallback, and came back wrapped in
a handle whose ``wait()`` called ``None.wait()``: an ``AttributeError`` in the user's loop, on
the host and on CUDA alike. Now the op is recorded with its bytes and no time (0 s: it ran
before the call, so the agent saw none of it), the handle's ``wait()`` returns at once, and
the viewer's bus bandwidth leaves the untimed op's bytes out instead of dividing them by
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.test_agent_device_timing import DeviceClock, FakeEvent
from zeroscope.agent import comm as agent_comm
from zeroscope.agent.comm import CollectiveTracker
from zeroscope.agent.schema import Collective, MemoryBytes, StepReport
from zeroscope.state.rank import summarize


def test_a_synchronous_op_is_recorded_with_no_time_and_its_wait_returns(agent: Any) -> None:
    tel, sink = agent
    for _ in range(2):  # the first op of the run, then the host's fast path (the seam)
        handle = tel.collective(None, op="all_reduce", nbytes=64, group_size=2, label="sync")
        assert handle.wait() is None
        tel.step_end(memory=MemoryBytes())
    reports = sink.reports()
    assert len(reports) == 2 and tel.errors == 0
    for r in reports:
        (c,) = r.collectives
        assert (c.op, c.nbytes, c.label, c.duration_s, c.exposed_s) == (
            "all_reduce",
            64,
            "sync",
            0.0,
            0.0,
        )
        assert r.collectives_unfinished == 0


def test_on_cuda_a_synchronous_op_records_no_event_and_never_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = DeviceClock()
    made: list[FakeEvent] = []

    def event() -> FakeEvent:
        made.append(FakeEvent(clock))
        return made[-1]

    monkeypatch.setattr(agent_comm, "_cuda_event", event)
    tracker = CollectiveTracker(cuda=True)
    handle = tracker.track(None, "broadcast", 32, 2, label="init")  # type: ignore[arg-type]
    assert handle.wait() is None and tracker.errors == 0 and made == []
    (rec,) = tracker.take_all()
    got = rec.resolve(step_start_ns=rec.start_ns, step_start_event=None)
    assert got is not None and (got.nbytes, got.duration_s, got.exposed_s) == (32, 0.0, 0.0)


def test_an_untimed_op_counts_in_volume_but_not_in_bus_bandwidth() -> None:
    timed = Collective("all_reduce", 1000, 2, 0.0, 0.001, 0.0)
    untimed = Collective("all_reduce", 1000, 2, 0.002, 0.0, 0.0)
    report = StepReport(rank=0, step=1, wall_ns=0, duration_s=0.01, collectives=[timed, untimed])
    s = summarize(report)
    assert s.comm_volume == 2 * 2000  # all-reduce volume is 2S, both ops
    # Bus bandwidth of the timed op alone: S * 2(n-1)/n / t = 1000 * 1 / 0.001.
    assert s.busbw == pytest.approx(1e6)
    assert s.ops["all_reduce"].busbw == pytest.approx(1e6)


@pytest.mark.gpu
def test_gpu_a_synchronous_nccl_op_through_the_agent() -> None:
    """A real blocking all-reduce on a one-rank NCCL group handed over as ``None``: before,
    ``wait()`` raised ``AttributeError: 'NoneType' object has no attribute 'wait'``."""
    import torch.distributed as dist

    from tests.test_agent_timeline import Sink
    from zeroscope.agent.live import LiveTelemetry

    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    tel.bind_device("cuda:0")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(1024, device="cuda")
        work = dist.all_reduce(t)  # synchronous: returns None
        tel.collective(work, op="all_reduce", nbytes=4096, group_size=1).wait()
        torch.cuda.synchronize()
        tel.step_end(memory=MemoryBytes())
        (r,) = sink.reports()
        errors = tel.errors
    finally:
        dist.destroy_process_group()
        tel.close()
    (c,) = r.collectives
    assert c.nbytes == 4096 and c.duration_s == 0.0 and errors == 0
