"""CUDA graph capture with the live agent (agent/capture.py): while the training thread's
stream is capturing, the agent makes no device event, issues no collective event or future
callback, and its sender thread queries no event; the capture is said once as an ``info`` Event.

Before, every phase mark and collective inside ``torch.cuda.graph`` recorded a timing event on
the capturing stream, and the sender thread queried older steps' events meanwhile: both are
illegal in the default global capture mode (the capture fails with "operation not permitted
when stream is capturing"). On the CPU the capture flag is a stub the test drives, and the
stand-in device logs any event made or queried while it is up.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.test_agent_timeline import FakeDevice, FakeEvent, Sink
from zeroscope.agent import capture
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.schema import Event, MemoryBytes


class CapturingDevice(FakeDevice):
    """A stand-in device whose stream may be capturing; logs what the CUDA rules forbid."""

    def __init__(self) -> None:
        super().__init__()
        self.capturing = False
        self.illegal: list[str] = []

    def event(self) -> FakeEvent:
        if self.capturing:
            self.illegal.append("event recorded while capturing")
        return WatchedEvent(self, self.enqueued)


class WatchedEvent(FakeEvent):
    device: CapturingDevice

    def query(self) -> bool:
        if self.device.capturing:
            self.device.illegal.append("event queried while capturing")
        return super().query()


class CapturedWork:
    """An NCCL Work issued inside a capture: its future must not be touched then."""

    def __init__(self, device: CapturingDevice) -> None:
        self.device = device
        self.waited = 0

    def get_future(self) -> Any:
        self.device.illegal.append("future callback added while capturing")
        raise AssertionError("no future during a capture")

    def wait(self) -> bool:
        self.waited += 1
        return True


@pytest.fixture
def rig(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[LiveTelemetry, Sink, CapturingDevice]]:
    dev = CapturingDevice()
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: dev.capturing)
    monkeypatch.setattr(capture, "state", capture.CaptureState())
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    tel._use_device_events(dev.event)
    yield tel, sink, dev
    tel.close()


def test_nothing_touches_the_device_while_a_graph_is_captured(
    rig: tuple[LiveTelemetry, Sink, CapturingDevice],
) -> None:
    tel, sink, dev = rig
    with tel.phase("forward"):  # step 1, on the device's axis; its events not reached yet
        dev.enqueued += 0.1
    tel.step_end(memory=MemoryBytes())
    for _ in range(2):  # step 2: two captures (a warm-up's and the real one)
        dev.capturing = True
        with tel.phase("forward"):
            work = CapturedWork(dev)
            handle = tel.collective(work, op="all_gather", nbytes=128, group_size=2, label="cg")
            handle.wait()
        assert sink.reports() == []  # the sender held step 1 and queried nothing
        dev.capturing = False
    assert work.waited == 1  # the user's wait still orders the stream
    tel.step_end(memory=MemoryBytes())
    dev.completed = 10.0
    tel.step_end(memory=MemoryBytes())
    reports = sink.reports()
    assert dev.illegal == [] and tel.errors == 0
    first, second = reports[:2]
    assert first.phases.forward == pytest.approx(0.1)  # device time
    # Each capture's op is recorded with its bytes and no time (it did not run then).
    assert [(c.label, c.nbytes, c.duration_s) for c in second.collectives] == [("cg", 128, 0.0)] * 2
    said = [m for m in sink.sent if isinstance(m, Event) and m.event == "info"]
    assert [m.message for m in said] == [capture.SAID]


def test_a_step_end_inside_a_capture_reads_no_loss_and_falls_back_to_the_host_axis(
    rig: tuple[LiveTelemetry, Sink, CapturingDevice],
) -> None:
    tel, sink, dev = rig
    dev.capturing = True
    tel.step_end(memory=MemoryBytes(), loss=torch.tensor(1.5))  # a tensor nothing filled yet
    dev.capturing = False
    tel.step_end(memory=MemoryBytes(), loss=torch.tensor(2.5))
    dev.completed = 10.0
    tel.step_end(memory=MemoryBytes())
    first, second = sink.reports()[:2]
    assert first.loss is None and second.loss == 2.5
    assert dev.illegal == [] and tel.errors == 0


@pytest.mark.gpu
def test_gpu_a_step_captured_in_a_cuda_graph_with_the_agent() -> None:
    """A real capture in the default global mode with the agent's phases inside it. Before,
    the phase marks recorded timing events on the capturing stream and the sender queried the
    previous step's events meanwhile, so the capture failed ("operation not permitted when
    stream is capturing") or the agent counted errors."""
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    tel.bind_device("cuda:0")
    model = torch.nn.Linear(64, 64).cuda()
    x = torch.randn(8, 64, device="cuda")
    with tel.phase("forward"):
        model(x)
    tel.step_end(memory=MemoryBytes())
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x)  # warm-up on a side stream, as torch's docs do
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph), tel.phase("forward"):
        y = model(x)
    with tel.phase("forward"):
        graph.replay()
    tel.step_end(memory=MemoryBytes())
    torch.cuda.synchronize()
    assert torch.allclose(y, model(x))
    tel.step_end(memory=MemoryBytes())
    errors = tel.errors  # (closing on a Sink, which has no connection state, counts one)
    tel.close()
    assert errors == 0
    assert any(isinstance(m, Event) and m.message == capture.SAID for m in sink.sent)
