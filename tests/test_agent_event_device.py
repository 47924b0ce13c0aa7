"""Every event the agent records goes on the Hello's device, not the current one.

An agent-API user who passes ``device="cuda:1"`` (to ``hello`` or ``bind_device``) but never
calls ``torch.cuda.set_device(1)`` has GPU 0 as the current device. Before, every phase, step
and collective event was recorded on GPU 0's current stream, idle: phases read ~0 s,
``elapsed_time`` between a GPU 0 and a GPU 1 event failed, and such collectives were dropped.
On the CPU, torch.cuda's events, streams and counters are stand-ins that note which device's
stream each event was recorded on.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.test_agent_timeline import FakeCuda, FakeDevice, FakeEvent, Sink
from zeroscope.agent import comm as agent_comm
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts


class _Work:
    def get_future(self) -> Any:
        raise RuntimeError("no future here")

    def wait(self) -> bool:
        return True


def test_every_event_goes_on_the_hellos_device_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, dev = FakeCuda(), FakeDevice()
    made: list[FakeEvent] = []

    def event(enable_timing: bool = False) -> FakeEvent:
        made.append(dev.event())
        return made[-1]

    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(torch.cuda, "Event", event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream", device))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # never set by the user
    monkeypatch.setattr(agent_comm, "EVENT_DEVICE", [None])
    from zeroscope.agent import rank_identity

    monkeypatch.setattr(rank_identity, "EVENT_DEVICE", agent_comm.EVENT_DEVICE)
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    try:
        tel.hello(
            config=ConfigSummary(stage=0, precision="bf16", dp_world_size=1),
            params=ParamCounts(total=1, trainable=1),
            device="cuda:1",
        )
        with tel.phase("forward"):
            dev.enqueued += 0.2
        handle = tel.collective(_Work(), op="all_reduce", nbytes=8, group_size=2)
        dev.enqueued += 0.1
        handle.wait()
        tel.step_end(memory=MemoryBytes())
        dev.completed = 10.0
        tel.step_end(memory=MemoryBytes())
        (first, _) = sink.reports()
        errors = tel.errors
    finally:
        tel.close()
    assert errors == 0 and len(made) >= 6  # probe, 2 phase marks, 3 collective, step end
    assert {e.stream for e in made} == {("stream", 1)}
    assert first.phases.forward == pytest.approx(0.2)
    (c,) = first.collectives
    # A device collective's duration is torch's own, from its Flight Recorder (agent/
    # device_collective.py; tests/test_agent_device_timing.py drives it): this fake device has
    # no recorder entry, so the duration is NA (clock "none"), never the events' guess.
    assert c.clock == "none" and (c.op, c.nbytes) == ("all_reduce", 8)


@pytest.mark.gpu
def test_gpu_events_on_the_hellos_device_without_set_device() -> None:
    """Needs two GPUs: work on cuda:1 while the current device stays 0. Before, the phase's
    events went on GPU 0's idle stream (forward ~0 s) and the loss was read before its copy
    landed."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    assert torch.cuda.current_device() == 0
    tel.bind_device("cuda:1")
    x = torch.randn(4096, 4096, device="cuda:1")
    with tel.phase("forward"):
        for _ in range(20):
            x = (x @ x).tanh()
        loss = x.sum()
    tel.step_end(memory=MemoryBytes(), loss=loss)
    torch.cuda.synchronize(1)
    tel.step_end(memory=MemoryBytes())
    tel.close()
    first = sink.reports()[0]
    assert first.phases.forward is not None and first.phases.forward > 1e-3
    assert first.loss == pytest.approx(float(loss), rel=1e-3)
