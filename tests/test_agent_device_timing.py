"""Collective timing on CUDA, checked on the CPU with a device clock we drive.

On CUDA a collective runs on the backend's stream while compute goes on. Its duration is
torch's own (CUDA events on the NCCL stream, read from its Flight Recorder by the op's group
and sequence number: agent/device_collective.py); its exposed time is the compute stream's
stall, events just before and after ``wait()``. Before, the duration ended at an event recorded
in the work's future callback, which runs on a pool stream that ``recordStream``s every output:
each freed buffer stayed reserved until the GPU passed it. The fakes below keep torch's
contracts: events carry a device time, ``wait()`` makes the compute stream wait for the op's
end, and the recorder's entry carries a duration once its work is retired; the work's future
raises if anyone attaches a callback. Init broadcasts were timed before the agent knew the
device; the engine now binds the device before its first collective.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.models import TinyGPT
from tests.recorder import RecordingTelemetry
from zeroscope.agent import api as agent_api
from zeroscope.agent import comm as agent_comm
from zeroscope.agent import device_collective
from zeroscope.agent.attach import flight_recorder
from zeroscope.agent.collective_record import END
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


class NoCallbacks:
    """A work's future: a callback attached to it would run on a pool stream that
    ``recordStream``s the op's outputs, which is what the agent must not do."""

    def then(self, callback: Any) -> None:
        raise AssertionError("the agent attached a future callback to a CUDA collective")


class FakeWork:
    def __init__(self, clock: DeviceClock, comm_end_ms: float) -> None:
        self.clock, self.comm_end_ms = clock, comm_end_ms

    def get_future(self) -> NoCallbacks:
        return NoCallbacks()

    def wait(self) -> bool:
        # The compute stream waits for the collective: work after this point starts no earlier.
        self.clock.stream_ms = max(self.clock.stream_ms, self.comm_end_ms)
        return True


class FakeRecorder:
    """torch's Flight Recorder ring as its dump shows it: (group, seq) -> entry."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def add(self, seq: int, op: str, duration_ms: float | None) -> dict[str, Any]:
        entry = {
            "process_group": ["0", "default_pg"],
            "collective_seq_id": seq,
            "record_id": seq,
            "profiling_name": f"nccl:{op}",
            "state": "scheduled" if duration_ms is None else "completed",
            "duration_ms": duration_ms,
        }
        self.entries.append(entry)
        return entry

    def dump(self) -> bytes:
        return json.dumps({"entries": self.entries}).encode()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> DeviceClock:
    clock = DeviceClock()
    monkeypatch.setattr(agent_comm, "_cuda_event", lambda: FakeEvent(clock))
    return clock


@pytest.fixture
def ring(monkeypatch: pytest.MonkeyPatch) -> FakeRecorder:
    """The default group's ops get sequence numbers 1, 2, ...; the recorder is on and timed."""
    fake = FakeRecorder()
    seqs = iter(range(1, 1000))
    monkeypatch.setattr(agent_comm, "default_group_sequence", lambda size: ("0", next(seqs)))
    monkeypatch.setattr(flight_recorder, "READER", flight_recorder.FlightRecorderReader(fake.dump))
    monkeypatch.setattr(flight_recorder, "FRESH_S", 0.0)  # every ask dumps again
    monkeypatch.setenv(flight_recorder.BUFFER_ENV, "64")
    monkeypatch.setenv(flight_recorder.TIMING_ENV, "1")
    return fake


def test_an_overlapped_collective_lasts_as_long_as_the_op_not_the_compute(
    clock: DeviceClock, ring: FakeRecorder
) -> None:
    tracker = CollectiveTracker(cuda=True)
    # Issued at 0 ms; the all-gather takes 10 ms on its stream while 100 ms of compute runs.
    handle = tracker.track(FakeWork(clock, comm_end_ms=10.0), "all_gather", 1 << 20, 2)
    ring.add(1, "all_gather", 10.0)
    clock.stream_ms = 100.0
    handle.wait()
    clock.device_ms = 1000.0  # the device has run everything
    (record,) = tracker.take_all()
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None and got.clock == "device"
    assert got.duration_s == pytest.approx(0.010)
    assert got.exposed_s == 0.0 and got.exposed_measured  # over before the loop waited


def test_an_exposed_collective_counts_the_compute_streams_stall(
    clock: DeviceClock, ring: FakeRecorder
) -> None:
    tracker = CollectiveTracker(cuda=True)
    handle = tracker.track(FakeWork(clock, comm_end_ms=30.0), "reduce_scatter", 1 << 20, 2)
    entry = ring.add(1, "reduce_scatter", None)  # not retired by torch's watchdog yet
    clock.stream_ms = 5.0  # 5 ms of compute, then the loop needs the result
    handle.wait()
    (record,) = tracker.take_all()
    assert record.resolve(step_start_ns=record.start_ns) is None  # device not there yet
    clock.device_ms = 1000.0
    assert record.resolve(step_start_ns=record.start_ns) is None  # torch has no duration yet
    entry.update(state="completed", duration_ms=30.0)
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None
    assert got.duration_s == pytest.approx(0.030)
    assert got.exposed_s == pytest.approx(0.025)  # the stall: 5 ms -> 30 ms on compute


def test_without_torchs_record_the_duration_is_na_and_the_stall_still_measured(
    clock: DeviceClock, ring: FakeRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No entry (the ring overwrote it), another op under that number, or the recorder off:
    the duration is NA (clock ``none``), never the compute stream's issue-to-wait gap."""
    tracker = CollectiveTracker(cuda=True)
    handles = [
        tracker.track(FakeWork(clock, comm_end_ms=10.0), "all_reduce", 1 << 20, 2) for _ in range(2)
    ]
    ring.add(2, "broadcast", 3.0)  # op 1 was overwritten; op 2's number holds another op
    clock.stream_ms = 40.0
    for h in handles:
        h.wait()
    clock.device_ms = 1000.0
    for record in tracker.take_all():
        got = record.resolve(step_start_ns=record.start_ns)
        assert got is not None and got.clock == "none" and got.duration_s == 0.0
        assert got.exposed_measured and got.exposed_s == 0.0  # the op was over at 10 ms
    monkeypatch.setenv(flight_recorder.BUFFER_ENV, "0")
    ring.add(3, "all_reduce", 10.0)
    tracker.track(FakeWork(clock, comm_end_ms=10.0), "all_reduce", 1 << 20, 2).wait()
    (record,) = tracker.take_all()
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None and got.clock == "none"


def test_a_duration_torch_never_retires_is_given_up(
    clock: DeviceClock, ring: FakeRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(device_collective, "GIVE_UP_S", 0.0)
    tracker = CollectiveTracker(cuda=True)
    tracker.track(FakeWork(clock, comm_end_ms=10.0), "all_gather", 8, 2).wait()
    ring.add(1, "all_gather", None)
    clock.device_ms = 1000.0
    (record,) = tracker.take_all()
    assert record.resolve(step_start_ns=record.start_ns) is None  # first look: wait
    got = record.resolve(step_start_ns=record.start_ns)
    assert got is not None and got.clock == "none"


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


def test_an_attached_gpu_op_is_timed_by_the_same_rules(
    clock: DeviceClock, ring: FakeRecorder
) -> None:
    """The attach's record of a GPU op (agent/attach/collectives.py) resolves through the same
    definition: torch's duration by sequence number, the compute stream's stall from the events
    around its wait. Before, it was clock ``none`` with exposed NA (no event was recorded)."""
    from zeroscope.agent.attach.collectives import STALL, CollectiveLog, LoggedOp

    log = CollectiveLog()
    log.add("all_reduce", 4096, 2, 0, None, cuda=True, sequence=("0", 1))
    (rec,) = log.records
    clock.stream_ms = 5.0  # the compute stream at 5 ms waits for an op ending at 30 ms
    before = FakeEvent(clock)
    clock.stream_ms = 30.0
    rec[STALL] = (before, FakeEvent(clock))
    rec[END] = 1  # the wait returned
    ring.add(1, "all_reduce", 30.0)
    assert LoggedOp(rec, {}).resolve(0) is None  # the device has not run the stall yet
    clock.device_ms = 1000.0
    got = LoggedOp(rec, {}).resolve(0)
    assert got is not None and got.clock == "device" and got.exposed_measured
    assert got.duration_s == pytest.approx(0.030) and got.exposed_s == pytest.approx(0.025)
    log.add("all_reduce", 4096, 2, 0, None, cuda=True, sequence=("0", 2))
    unwaited = log.records[-1]
    unwaited[END] = 1
    ring.add(2, "all_reduce", 4.0)
    got = LoggedOp(unwaited, {}).resolve(0)  # on a side stream, or never waited: no stall
    assert got is not None and got.clock == "device" and not got.exposed_measured


def test_the_default_groups_sequence_number_names_each_op() -> None:
    """What the engine's GPU path reads right after issuing an op (one-rank gloo group here:
    the same ProcessGroup API): each op its own number, an op of another group size none."""
    from zeroscope.agent.device_collective import default_group_sequence

    assert default_group_sequence(1) is None  # no group yet
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        t = torch.ones(4)
        seen = []
        for _ in range(3):
            dist.all_reduce(t)
            seen.append(default_group_sequence(1))
        name = dist.distributed_c10d._get_default_group().group_name
        first = seen[0][1]
        assert seen == [(name, first), (name, first + 1), (name, first + 2)]
        assert default_group_sequence(2) is None  # not the world's size: not this group's op
    finally:
        dist.destroy_process_group()
