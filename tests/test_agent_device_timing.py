"""Collective timing on CUDA, checked on the CPU with a device clock we drive.

On CUDA a collective runs on the backend's stream while compute goes on. Before the fix its
duration was read from the compute stream (issue event -> the event after ``wait()``), so any
compute overlapped with the op was counted as comm time and busbw read 10-1000x too low under
prefetch. Now the duration ends at an event recorded in the work's future callback, which torch
runs on streams that wait for the collective's own CUDA events. The fake below keeps exactly
that contract: events carry a device time; the future's callback runs with the "current stream"
at the collective's end. Init broadcasts were timed before the agent knew the device (host
futures that complete at enqueue: ~0 s); the engine now binds the device before its first
collective.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.models import TinyGPT
from tests.recorder import RecordingTelemetry
from zeroscope.agent import api as agent_api
from zeroscope.agent import comm as agent_comm
from zeroscope.agent.comm import CollectiveTracker
from zeroscope.engine import initialize
from zeroscope.engine.process_group import WORLD1_COLLECTIVES_ENV


class DeviceClock:
    """The time (ms) of the stream an event is recorded on, and how far the device has run."""

    def __init__(self) -> None:
        self.stream_ms = 0.0
        self.device_ms = 0.0


class FakeEvent:
    def __init__(self, clock: DeviceClock) -> None:
        self.clock, self.at = clock, clock.stream_ms

    def query(self) -> bool:
        return self.clock.device_ms >= self.at

    def elapsed_time(self, later: FakeEvent) -> float:
        assert self.query() and later.query(), "elapsed_time on an event not yet completed"
        return later.at - self.at


class FakeFuture:
    """An NCCL-like future: complete at enqueue; callbacks run on streams that wait for the
    collective's end (torch's ``Future.then`` contract for CUDA futures)."""

    def __init__(self, clock: DeviceClock, comm_end_ms: float) -> None:
        self.clock, self.comm_end_ms = clock, comm_end_ms

    def then(self, callback: Callable[[Any], Any]) -> None:
        compute = self.clock.stream_ms
        self.clock.stream_ms = self.comm_end_ms
        try:
            callback(self)
        finally:
            self.clock.stream_ms = compute


class FakeWork:
    def __init__(self, clock: DeviceClock, comm_end_ms: float) -> None:
        self.clock, self.future = clock, FakeFuture(clock, comm_end_ms)
        self.comm_end_ms = comm_end_ms

    def get_future(self) -> FakeFuture:
        return self.future

    def wait(self) -> bool:
        # The compute stream waits for the collective: work after this point starts no earlier.
        self.clock.stream_ms = max(self.clock.stream_ms, self.comm_end_ms)
        return True


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> DeviceClock:
    clock = DeviceClock()
    monkeypatch.setattr(agent_comm, "_cuda_event", lambda: FakeEvent(clock))
    return clock


def test_an_overlapped_collective_lasts_as_long_as_the_op_not_the_compute(
    clock: DeviceClock,
) -> None:
    tracker = CollectiveTracker(cuda=True)
    # Issued at 0 ms; the all-gather takes 10 ms on its stream while 100 ms of compute runs.
    handle = tracker.track(FakeWork(clock, comm_end_ms=10.0), "all_gather", 1 << 20, 2)
    clock.stream_ms = 100.0
    handle.wait()
    clock.device_ms = 1000.0  # the device has run everything
    (record,) = tracker.take_all()
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None
    assert got.duration_s == pytest.approx(0.010)
    assert got.exposed_s == 0.0  # it was over before the loop waited


def test_an_exposed_collective_counts_its_wait(clock: DeviceClock) -> None:
    tracker = CollectiveTracker(cuda=True)
    handle = tracker.track(FakeWork(clock, comm_end_ms=30.0), "reduce_scatter", 1 << 20, 2)
    clock.stream_ms = 5.0  # 5 ms of compute, then the loop needs the result
    handle.wait()
    (record,) = tracker.take_all()
    assert record.resolve(step_start_ns=record.start_ns) is None  # device not there yet
    clock.device_ms = 1000.0
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None
    assert got.duration_s == pytest.approx(0.030)
    assert got.exposed_s == pytest.approx(0.025)


def test_without_a_future_the_duration_ends_with_the_wait(
    clock: DeviceClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    tracker = CollectiveTracker(cuda=True)
    work = FakeWork(clock, comm_end_ms=10.0)
    monkeypatch.setattr(work, "get_future", lambda: (_ for _ in ()).throw(RuntimeError("none")))
    handle = tracker.track(work, "all_reduce", 1 << 20, 2)
    clock.stream_ms = 40.0
    handle.wait()
    clock.device_ms = 1000.0
    (record,) = tracker.take_all()
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None and got.duration_s == pytest.approx(0.040)


class OrderRecorder(RecordingTelemetry):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def bind_device(self, device: str) -> None:
        self.calls.append(f"bind:{device}")

    def collective(self, work: Any, **kwargs: Any) -> Any:
        self.calls.append(str(kwargs["op"]))
        return super().collective(work, **kwargs)


def test_the_device_is_bound_before_the_engines_first_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At world 1 with real collectives: stage 3 broadcasts its parameters at init; the agent
    must know the device before the first one."""
    monkeypatch.setenv(WORLD1_COLLECTIVES_ENV, "1")
    recorder = OrderRecorder()
    agent_api.set_telemetry(recorder)
    ours = not dist.is_initialized()
    try:
        torch.manual_seed(0)
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 3},
        }
        engine, *_ = initialize(model=TinyGPT(), config=config)
    finally:
        agent_api.set_telemetry(None)
        if ours and dist.is_initialized():
            dist.destroy_process_group()
    assert recorder.calls[0] == f"bind:{engine.device}"
    assert len(recorder.calls) > 1, "no init collective at world 1 with real collectives on"
