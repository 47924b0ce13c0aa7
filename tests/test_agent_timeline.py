"""Tier 1: every StepReport covers its own step's phases and collectives on one time axis
(agent/timeline.py, agent/pending.py), and device memory peaks are read without resetting the
user's allocator statistics (agent/device_memory.py).

Oracles: an injected sleep in the engine's Adam (it must show in the step it happened in), the
test's own clock, and a stand-in device whose event times and completion the test controls (the
CUDA path, on CPU)."""

from __future__ import annotations

import time
from itertools import pairwise
from typing import Any

import pytest
import torch

from tests.models import TinyGPT, batches
from zeroscope.agent import api
from zeroscope.agent.device_memory import DevicePeaks
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.pending import MAX_DEFER_STEPS
from zeroscope.agent.schema import MemoryBytes, Message, StepReport


class Sink:
    """Stands in for the Publisher: keeps what would have been sent."""

    reached = connected = True  # the Publisher's connection state: always up
    refused = ""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.batches: list[list[Message]] = []
        """What each ``send_batch`` was given (one ZeroMQ message on a real publisher)."""
        self.drain: Any = lambda: None
        """The agent's ``drain``: reports are sent by its sampler thread, so reading what was
        sent first sends what is ready, on this thread."""

    def send(self, message: Message) -> bool:
        self.sent.append(message)
        return True

    set_sticky = send

    def send_batch(self, messages: list[Message]) -> int:
        self.batches.append(list(messages))
        return sum(self.send(m) for m in messages)

    def poll_connection(self) -> None:
        pass

    def wait_live(self, timeout: float) -> bool:
        return True  # always up

    def close(self) -> None:
        pass

    def count_dropped(self, n: int) -> None:
        pass

    def reports(self) -> list[StepReport]:
        self.drain()
        return [m for m in self.sent if isinstance(m, StepReport)]


def test_step_end_inside_a_phase_closes_it_in_that_step(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    with tel.phase("forward"):
        time.sleep(0.01)
    # An independent clock around the optimizer's part of step 1: the phase must hold at
    # least the sleep in it and no more than the window the test saw (whatever the load), and
    # so none of the sleep after the step's end.
    before = time.perf_counter()
    with tel.phase("optimizer"):
        time.sleep(0.03)
        tel.step_end(memory=MemoryBytes())  # as the engine does: from inside its optimizer
        window = time.perf_counter() - before
        time.sleep(0.02)  # after the step's end: time between steps, not step 1's optimizer
    with tel.phase("forward"):
        time.sleep(0.01)
    tel.step_end(memory=MemoryBytes())
    first, second = sink.reports()
    assert first.phases.optimizer is not None and 0.03 <= first.phases.optimizer <= window
    assert second.phases.optimizer is None  # nothing of step 1's optimizer leaks in
    assert second.phases.data is not None and second.phases.data >= 0.02
    assert [p.name for p in first.phase_spans] == ["forward", "optimizer"]
    assert [p.name for p in second.phase_spans] == ["data", "forward"]
    for r in (first, second):  # spans on the step's axis, inside the step
        assert all(p.start_s >= 0 and p.start_s + p.duration_s <= r.duration_s + 1e-6
                   for p in r.phase_spans)  # fmt: skip


def test_an_evaluation_between_steps_is_its_own_phase_not_the_next_forward(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    with tel.phase("forward"):
        time.sleep(0.01)
    tel.step_end(memory=MemoryBytes())
    # A trainer's evaluation after step 1: two forwards with autograd off, metrics between.
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(2):
            with tel.phase("forward"):
                time.sleep(0.02)
            time.sleep(0.03)  # its metrics, its next batch
    evaluation = time.perf_counter() - t0
    time.sleep(0.02)  # the training batch
    t1 = time.perf_counter()
    with tel.phase("forward"):
        time.sleep(0.01)
    forward = time.perf_counter() - t1
    tel.step_end(memory=MemoryBytes())
    _, second = sink.reports()
    # Before: the two eval forwards were summed into step 2's forward (0.05 s against its own
    # 0.01 s), and everything else between the steps read as data loading.
    assert second.phases.forward is not None and 0.01 <= second.phases.forward <= forward
    ev = second.phases.eval
    assert ev is not None and 0.02 + 0.03 + 0.02 <= ev <= evaluation  # its forwards, between
    assert second.phases.data is not None and second.phases.data >= 0.03 + 0.02
    # The time before it (a trainer's logging) and after it (the training batch) stays data.
    assert [p.name for p in second.phase_spans] == ["data", "eval", "data", "forward"]
    spans = second.phase_spans
    assert spans[0].start_s == 0.0
    for a, b in pairwise(spans):  # back to back
        assert b.start_s == pytest.approx(a.start_s + a.duration_s, abs=1e-9)


def test_an_evaluation_before_training_is_no_part_of_step_one(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    with torch.no_grad(), tel.phase("forward"):  # trainer.evaluate() before trainer.train()
        time.sleep(0.05)
    t0 = time.perf_counter()
    with tel.phase("forward"):
        time.sleep(0.01)
    tel.step_end(memory=MemoryBytes())
    step = time.perf_counter() - t0
    (first,) = sink.reports()
    # Before: step 1 started at the evaluation's forward and held it (0.06 s for 0.01 s).
    assert first.phases.eval is None and [p.name for p in first.phase_spans] == ["forward"]
    assert 0.01 <= first.duration_s <= step


def test_step_one_runs_from_where_a_frontend_said_it_begins(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    """An HF Trainer's on_step_begin (``begin_first_step``) starts step 1 where its forward ran
    unseen (a model found at its first optimizer step): before, step 1 ran from its optimizer
    phase, the first thing seen, and read that phase alone. Only step 1: step 2 runs from step
    1's end, the call then a no-op."""
    tel, sink = agent
    t0 = time.perf_counter()
    tel.begin_first_step()
    time.sleep(0.05)  # the forward and backward no wrapper saw
    with tel.phase("optimizer"):
        time.sleep(0.01)
    tel.step_end(memory=MemoryBytes())
    step = time.perf_counter() - t0
    time.sleep(0.03)  # between the steps: step 2's time
    tel.begin_first_step()  # step 2's: nothing (it runs from step 1's end)
    time.sleep(0.02)
    tel.step_end(memory=MemoryBytes())
    first, second = sink.reports()
    assert 0.06 <= first.duration_s <= step, first
    assert [p.name for p in first.phase_spans] == ["optimizer"]
    assert first.phase_spans[0].start_s >= 0.05
    assert second.duration_s >= 0.05, second


SLEEP_S = 0.2


def _engine_run(
    monkeypatch: pytest.MonkeyPatch, config: dict[str, Any], steps: int
) -> tuple[list[StepReport], list[float], list[float]]:
    """The bundled engine on one rank, reporting to a LiveTelemetry; Adam sleeps SLEEP_S in
    step 3 only. Returns the reports, each step's optimizer time on the test's own clock
    (around the engine's whole optimizer step) and each boundary ``step()`` call's wall time
    (the call the optimizer phase lies inside)."""
    from zeroscope.engine import engine as engine_module
    from zeroscope.engine.api import initialize

    real_adam = engine_module.adam_step
    state: dict[str, Any] = {"engine": None, "slept": False}

    def slow_adam(*args: Any, **kwargs: Any) -> Any:
        eng = state["engine"]
        if eng is not None and eng.global_steps == 2 and not state["slept"]:
            state["slept"] = True
            time.sleep(SLEEP_S)
        return real_adam(*args, **kwargs)

    monkeypatch.setattr(engine_module, "adam_step", slow_adam)
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    api.set_telemetry(tel)
    clock: list[float] = []
    try:
        torch.manual_seed(0)
        eng, _, _, _ = initialize(model=TinyGPT(), config=config)
        state["engine"] = eng
        model_step = eng._take_model_step

        def timed_step(*args: object, **kwargs: object) -> None:
            t0 = time.perf_counter()
            model_step(*args, **kwargs)
            clock.append(time.perf_counter() - t0)

        eng._take_model_step = timed_step
        gas = config.get("gradient_accumulation_steps", 1)
        windows: list[float] = []
        for x, y in batches(steps * gas, 2, seed=1):
            loss = eng(x, y)
            eng.backward(loss)
            stepped, t0 = len(clock), time.perf_counter()
            eng.step()
            if len(clock) > stepped:
                windows.append(time.perf_counter() - t0)
        tel.close()
    finally:
        api.set_telemetry(None)
    return sink.reports(), clock, windows


def test_the_optimizer_time_of_a_step_is_reported_in_that_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    }
    reps, clock, windows = _engine_run(monkeypatch, config, steps=5)
    assert [r.step for r in reps] == [1, 2, 3, 4, 5]
    assert clock[2] >= SLEEP_S
    for r, window in zip(reps, windows, strict=True):
        # Each step's optimizer phase is that step's own (step 1 has one too): it lies inside
        # that step's boundary step() call, on the test's own clock, whatever the load. Before
        # the fix step k carried step k-1's, so step 4's phase held the sleep its own step()
        # call never saw.
        assert r.phases.optimizer is not None
        assert r.phases.optimizer <= window + 1e-3
    optimizer_3 = reps[2].phases.optimizer
    assert optimizer_3 is not None and optimizer_3 >= SLEEP_S  # the sleep is in its own step


class FakeDevice:
    """A device that runs behind the host: events land at the device time the test enqueued
    up to, and complete when the test lets the device get there."""

    def __init__(self) -> None:
        self.enqueued = 0.0
        self.completed = 0.0

    def event(self) -> FakeEvent:
        return FakeEvent(self, self.enqueued)


class FakeEvent:
    def __init__(self, device: FakeDevice, at: float) -> None:
        self.device, self.at = device, at

    def record(self, stream: Any = None) -> None:
        self.stream = stream

    def query(self) -> bool:
        return self.device.completed >= self.at

    def synchronize(self) -> None:
        self.device.completed = max(self.device.completed, self.at)

    def elapsed_time(self, other: FakeEvent) -> float:
        return (other.at - self.at) * 1e3  # milliseconds, as torch.cuda.Event


def test_on_a_device_the_axis_is_the_devices_and_the_report_waits_for_it(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    dev = FakeDevice()
    tel._use_device_events(dev.event)
    with tel.phase("forward"):
        dev.enqueued += 0.30  # 300 ms of kernels, enqueued in no host time
    with tel.phase("backward"):
        dev.enqueued += 0.50
    tel.step_end(memory=MemoryBytes())
    assert sink.reports() == []  # the device has not reached the step's end yet
    dev.completed = 0.5
    tel.step_end(memory=MemoryBytes())
    assert sink.reports() == []
    dev.completed = 10.0
    tel.step_end(memory=MemoryBytes())
    first = sink.reports()[0]
    assert first.phases.forward == pytest.approx(0.30)
    assert first.phases.backward == pytest.approx(0.50)
    assert first.duration_s == pytest.approx(0.80)
    assert [(p.name, round(p.start_s, 6)) for p in first.phase_spans] == [
        ("forward", 0.0),
        ("backward", 0.3),
    ]


def test_a_device_copy_is_placed_where_the_device_ran_it_not_where_the_host_queued_it(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    """An offload copy queued behind 300 ms of kernels runs 300 ms into the step on the
    device. Its host instants are when it was queued (~0 s in): the report places it at its
    end event less its duration. (Placed at the host start, it would read 0.0 s: a host
    start paired with a device duration.)"""
    tel, sink = agent
    dev = FakeDevice()
    tel._use_device_events(dev.event)
    with tel.phase("forward"):
        dev.enqueued += 0.30  # 300 ms of kernels, enqueued in no host time
    with tel.phase("optimizer"):
        queued = time.perf_counter_ns()
        dev.enqueued += 0.02  # the copy itself: 20 ms on the device
        copy_end = dev.event()
        tel.transfer("h2d", 4096, queued, queued + 20_000_000, "offload", end_event=copy_end)
    tel.step_end(memory=MemoryBytes())
    dev.completed = 10.0
    tel.step_end(memory=MemoryBytes())
    (t,) = sink.reports()[0].transfers
    assert t.duration_s == pytest.approx(0.02)
    assert t.start_s == pytest.approx(0.30)


def test_without_device_events_a_copy_keeps_its_host_instants(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    """On the host axis (CPU) the caller's instants are the copy's own: the end event, given
    or not, is not read."""
    tel, sink = agent
    t0 = time.perf_counter_ns()
    with tel.phase("optimizer"):
        tel.transfer("d2h", 8, t0 + 5_000_000, t0 + 7_000_000, "offload")
    tel.step_end(memory=MemoryBytes())
    (t,) = sink.reports()[0].transfers
    assert t.duration_s == pytest.approx(0.002)
    assert 0.0 < t.start_s <= 0.005  # 5 ms after t0, the phase entered just after t0


class _NeverDone:
    """A Work that never completes (a CUDA collective whose wait() is never called)."""

    def get_future(self) -> torch.futures.Future:
        return torch.futures.Future()

    def wait(self) -> None:
        raise AssertionError("never waited for")


def test_a_collective_that_never_completes_holds_its_report_a_bounded_time(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    # The engine keeps the handle (a Work it dropped would count as ended: agent/comm.py).
    handle = tel.collective(_NeverDone(), op="broadcast", nbytes=8, group_size=2)
    tel.step_end(memory=MemoryBytes())
    for _ in range(MAX_DEFER_STEPS):
        tel.step_end(memory=MemoryBytes())
    assert sink.reports() == []  # held, and the later reports behind it, in order
    tel.step_end(memory=MemoryBytes())
    reps = sink.reports()
    assert [r.step for r in reps] == list(range(1, MAX_DEFER_STEPS + 3))
    assert reps[0].collectives == [] and reps[0].collectives_unfinished == 1
    del handle


class FakeCuda:
    """torch.cuda's memory counters, driven by the test; reset is a failure."""

    def __init__(self) -> None:
        self.allocated = 100
        self.peak = 100

    def memory_allocated(self, device: Any = None) -> int:
        return self.allocated

    def memory_reserved(self, device: Any = None) -> int:
        return 1000

    def max_memory_allocated(self, device: Any = None) -> int:
        return self.peak

    def alloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        raise AssertionError("the profiler reset the user's peak memory statistics")


def test_device_peaks_never_reset_the_users_statistics() -> None:
    cuda = FakeCuda()
    peaks = DevicePeaks(cuda)
    cuda.alloc(500)  # step 1 reaches a new process peak (600) between two marks
    cuda.alloc(-500)
    peaks.sample()
    assert peaks.take() == (100, 1000, 600)  # exact: the process peak rose in this step
    cuda.alloc(300)  # step 2: 400 at a mark, below the process peak
    peaks.sample()
    cuda.alloc(-300)
    assert peaks.take() == (100, 1000, 400)  # the highest sample
    cuda.alloc(200)  # step 3: a transient between marks below the old peak is not seen
    cuda.alloc(-200)
    assert peaks.take() == (100, 1000, 100)
    assert cuda.peak == 600  # what the user's max_memory_allocated() reads is untouched


def test_the_cuda_path_of_the_agent_on_a_stand_in_device(
    agent: tuple[LiveTelemetry, Sink], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's CUDA mode end to end, with torch.cuda's counters and events replaced by
    stand-ins: device axis, allocator figures, and no reset of the user's statistics."""
    tel, sink = agent
    cuda, dev = FakeCuda(), FakeDevice()
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", cuda.reset_peak_memory_stats)
    monkeypatch.setattr(torch.cuda, "Event", lambda enable_timing=False: dev.event())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("stream", device))
    from zeroscope.agent.schema import ConfigSummary, ParamCounts

    tel.hello(
        config=ConfigSummary(stage=0, precision="bf16", dp_world_size=1),
        params=ParamCounts(total=1, trainable=1),
        device="cuda:0",
    )
    assert tel.cuda and tel.errors == 0
    for _ in range(2):
        with tel.phase("forward"):
            cuda.alloc(700)
            dev.enqueued += 0.2
        with tel.phase("backward"):
            cuda.alloc(-700)
            dev.enqueued += 0.3
        tel.step_end(memory=MemoryBytes(params=1, grads=1, optim=1))
    dev.completed = 10.0
    tel.step_end(memory=MemoryBytes())
    first, second = sink.reports()[:2]
    assert first.memory.device_peak == 800 and second.memory.device_peak == 800
    assert first.memory.device_allocated == 100 and first.memory.device_reserved == 1000
    assert first.phases.forward == pytest.approx(0.2) and second.duration_s == pytest.approx(0.5)
    assert cuda.peak == 800 and tel.errors == 0


@pytest.mark.gpu
def test_gpu_an_offload_copy_starts_where_the_device_ran_it() -> None:
    """A 16 MiB copy queued behind a ~0.1 s kernel: its report starts after the kernel. The
    old report started it at the host instant it was queued (~0 s, with a device duration)."""
    from bench.gpu_offload_checks import copy_placed_on_device_axis

    row = copy_placed_on_device_axis(torch.device("cuda:0"))
    assert row["verdict"] == "PASS", row
