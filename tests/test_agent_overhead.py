"""Tier 1: the mechanism that keeps the agent's cost on the training thread small (the agent's overhead budget, agent/cost.py),
pinned without timing anything: the agent's own cost counters against the test's clock, no
Python callback per collective on CPU, encoding on another thread, nothing blocking when the
collector is gone. The cost itself is measured by ``bench/agent_overhead.py``."""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.test_agent_timeline import Sink
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.outbox import MAX_QUEUED, WAKE_INTERVAL_S
from zeroscope.agent.publish import EARLY_HOLD, Publisher
from zeroscope.agent.schema import Bye, Event, MemoryBytes, Message, StepReport


class SleepyWork:
    """A finished Work whose ``wait()`` takes ``wait_s`` (time that is the job's, not the
    agent's)."""

    def __init__(self, wait_s: float = 0.0) -> None:
        self.wait_s = wait_s

    def wait(self) -> bool:
        time.sleep(self.wait_s)
        return True

    def is_completed(self) -> bool:
        return True


def test_the_agent_counts_its_own_time_and_not_the_jobs(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    outside = 0
    for _ in range(3):
        t0 = time.perf_counter_ns()
        with tel.phase("forward"):
            time.sleep(0.02)  # the job's compute: not the agent's time
        handle = tel.collective(SleepyWork(0.02), op="all_reduce", nbytes=8, group_size=2)
        handle.wait()  # the wait itself: not the agent's time either
        t_end = time.perf_counter_ns()
        tel.step_end(memory=MemoryBytes())
        last_step_end = time.perf_counter_ns() - t_end
        outside += time.perf_counter_ns() - t0
    cost = tel.cost
    assert (cost.steps, cost.collectives) == (3, 3)
    # Against the caller's clock: the agent's time is inside it, and without the 2 x 20 ms per
    # step the job spent sleeping (a counter that took in the compute or the wait fails here).
    assert cost.collective_ns > 0 and cost.ns > 0
    agent_bound = outside - 3 * 0.04e9
    assert cost.ns + cost.collective_ns < agent_bound
    # The per-step and per-collective figures each stay within the caller's share per item.
    per_step, per_collective = cost.per_step_us(), cost.per_collective_us()
    assert per_step is not None and 0 < per_step * 1e3 < agent_bound / 3
    assert per_collective is not None and 0 < per_collective * 1e3 < agent_bound / 3
    tel.close()
    reports = sink.reports()
    assert [r.step for r in reports] == [1, 2, 3]
    shares = [r.agent_overhead_s for r in reports]
    assert all(s is not None and s > 0 for s in shares)
    # Each report carries the time since the previous one, so the wire's shares add up to all
    # the agent's time but the last step_end's own, which the caller timed (+ rounding).
    unreported = cost.ns + cost.collective_ns - sum(s for s in shares if s is not None) * 1e9
    assert -10 <= unreported <= last_step_end + 10


class CountingFuture:
    def __init__(self, owner: CountingWork) -> None:
        self.owner = owner

    def then(self, callback: object) -> CountingFuture:
        self.owner.callbacks += 1
        return self

    def done(self) -> bool:
        return self.owner.done


class CountingWork:
    """A Work that counts the callbacks attached to its future; done when the test says."""

    def __init__(self, done: bool = True) -> None:
        self.done = done
        self.callbacks = 0

    def get_future(self) -> CountingFuture:
        return CountingFuture(self)

    def is_completed(self) -> bool:
        return self.done

    def wait(self) -> bool:
        return True


def test_no_callback_per_collective_on_cpu_and_ops_never_waited_end_at_the_boundary(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    works = [CountingWork(done=i != 150) for i in range(200)]
    handles = [
        tel.collective(w, op="all_gather", nbytes=8, group_size=2, label=str(i))
        for i, w in enumerate(works)
    ]
    for h in handles[:100]:
        h.wait()
    t0 = time.perf_counter_ns()
    tel.step_end(memory=MemoryBytes())  # ops 100-199 never waited; op 150 still in flight
    in_step_end = (time.perf_counter_ns() - t0) / 1e9
    assert sum(w.callbacks for w in works) == 0
    tel.drain()
    assert sink.reports() == []  # the report waits for op 150
    time.sleep(0.01)
    works[150].done = True  # completes between steps, seen by the next look
    tel.step_end(memory=MemoryBytes())
    tel.drain()
    first = sink.reports()[0]
    assert len(first.collectives) == 200 and first.collectives_unfinished == 0
    assert sum(w.callbacks for w in works) == 0
    ends = {c.label: c.start_s + c.duration_s for c in first.collectives}
    # Complete when the step ended: stamped at that boundary (inside the step_end call).
    assert all(ends[str(i)] <= first.duration_s + in_step_end for i in range(100, 200) if i != 150)
    assert ends["150"] >= first.duration_s + 0.01  # not before it was seen complete


class BuiltinWork:
    """A finished Work whose ``wait`` is C code (like torch's): any Python call seen during a
    collective is the agent's."""

    wait = staticmethod(time.perf_counter)

    def is_completed(self) -> bool:
        return True


def python_calls(run: Callable[[], object]) -> list[str]:
    """The Python functions entered while ``run`` runs (C functions not counted)."""
    import sys

    calls: list[str] = []

    def profile(frame: object, event: str, arg: object) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)  # type: ignore[attr-defined]

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return calls[1:]  # the first is run itself


def test_a_collective_and_a_plain_steps_phases_run_no_agent_code_but_their_own_call(
    agent: tuple[LiveTelemetry, Sink], seam: str
) -> None:
    """Each Python frame runs cold between the engine's kernels (~10x its hot-loop cost), so the
    per-collective and per-phase paths make none beyond the seam call itself: no __init__, no
    helper, no callback; the C seam runs no Python at all per collective. A step whose
    activations are counted (steps 1-3, then every 10th) takes the full path; its spans and the
    plain steps' come out the same."""
    tel, sink = agent
    python = seam == "Python seam"
    handle: list[Any] = []
    work = BuiltinWork()

    def issue() -> None:
        handle.append(tel.collective(work, op="all_reduce", nbytes=8, group_size=2))

    seen: dict[int, list[str]] = {}
    for step in range(1, 6):

        def phases() -> None:
            with tel.phase("forward"):
                time.sleep(0.002)
            with tel.phase("backward"):
                time.sleep(0.004)

        seen[step] = python_calls(phases)
        if step == 4:  # step 1's first collective also marks where the step began
            assert python_calls(issue) == (["__call__"] if python else [])
            assert python_calls(lambda: handle[0].wait()) == (["wait"] if python else [])
        tel.step_end(memory=MemoryBytes())
    assert "_phase_enter" in seen[1] and "_phase_enter" in seen[3]  # counted steps
    for step in (4, 5):
        assert seen[step] == ["phase", "__init__", "__enter__", "__exit__"] * 2, seen[step]
    reports = sink.reports()
    assert [r.step for r in reports] == [1, 2, 3, 4, 5]
    for r in reports:
        names = [p.name for p in r.phase_spans]
        assert names == (
            ["forward", "backward"] if r.step == 1 else ["data", "forward", "backward"]
        )
        assert r.phases.forward >= 0.002 and r.phases.backward >= 0.004
        assert r.phases.forward + r.phases.backward <= r.duration_s
    assert [len(r.collectives) for r in reports] == [0, 0, 0, 1, 0]


def test_the_cuda_path_attaches_no_future_callback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A callback on a CUDA work's future runs on a pool stream that ``recordStream``s the op's
    outputs (freed buffers stay reserved until the GPU passes them): the device path takes its
    duration from torch's Flight Recorder instead (agent/device_collective.py)."""
    from zeroscope.agent import comm

    monkeypatch.setattr(comm, "_cuda_event", lambda: object())
    tracker = comm.CollectiveTracker(cuda=True)
    works = [CountingWork() for _ in range(3)]
    for w in works:
        tracker.track(w, "all_reduce", 8, 2)
    assert [w.callbacks for w in works] == [0, 0, 0]


def test_the_agent_never_keeps_a_work_the_engine_dropped(
    agent: tuple[LiveTelemetry, Sink],
) -> None:
    tel, sink = agent
    work = CountingWork(done=False)  # still running when the engine lets go of it
    alive = weakref.ref(work)
    handle = tel.collective(work, op="all_gather", nbytes=8, group_size=2)
    del work, handle
    assert alive() is None  # no reference left anywhere in the agent: its tensors are freed
    tel.step_end(memory=MemoryBytes())
    tel.drain()
    (report,) = sink.reports()
    assert len(report.collectives) == 1 and report.collectives_unfinished == 0


def test_reports_and_events_are_encoded_off_the_training_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zeroscope.agent import publish
    from zeroscope.collector.server import Collector, wait_for

    encoded: list[tuple[str, int]] = []
    real_encode = publish.encode

    def spy(message: Message) -> bytes:
        encoded.append((type(message).__name__, threading.get_ident()))
        return real_encode(message)

    monkeypatch.setattr(publish, "encode", spy)
    got: list[Message] = []
    with Collector() as col:
        col.add_listener(got.append)
        publisher = Publisher(col.ingest_address)
        assert publisher.wait_connected(10.0)  # as start_agent does: reports leave at once
        tel = LiveTelemetry(publisher, sample_interval=60.0)
        try:
            for _ in range(3):
                handle = tel.collective(SleepyWork(), op="all_reduce", nbytes=8, group_size=2)
                handle.wait()
                tel.event("overflow", "grad overflow")
                tel.step_end(memory=MemoryBytes(), loss=float("nan"))
            assert wait_for(lambda: sum(isinstance(m, StepReport) for m in got) == 3)
        finally:
            tel.close()
    threads = {kind: {t for k, t in encoded if k == kind} for kind, _ in encoded}
    main = threading.get_ident()
    assert threads["StepReport"] and main not in threads["StepReport"]
    assert threads["Event"] and main not in threads["Event"]  # overflow and nan_loss events
    assert sum(isinstance(m, Event) for m in got) == 6


def test_step_ends_wake_the_sender_at_most_every_wake_interval() -> None:
    """A report leaves as its step ends when the previous wake-up was WAKE_INTERVAL_S ago or
    more (a rank killed by SIGKILL loses at most its last step, or its last ~0.5 s of short
    steps); shorter steps ride along with the next wake-up, in one ZeroMQ message with it, and
    never wait for the sender's own timer (pushed here to a minute away)."""
    sink = Sink()  # no drain on this thread: only the sender thread sends
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]

    def sent() -> list[int]:
        return [m.step for m in sink.sent if isinstance(m, StepReport)]

    def step() -> None:
        tel.collective(SleepyWork(), op="all_reduce", nbytes=8, group_size=2).wait()
        tel.step_end(memory=MemoryBytes())

    def wait_sent(expected: list[int]) -> None:
        deadline = time.monotonic() + 10.0  # far less than the timer's minute
        while sent() != expected and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sent() == expected

    try:
        tel.sampler._wake = 60.0  # the timer ticks once a minute from its next sleep on
        time.sleep(0.6)  # longer than the sleep it is in (0.5 s at most)
        step()  # the first step end wakes the sender
        wait_sent([1])
        step()  # within WAKE_INTERVAL_S of that wake-up: handed over, nobody woken
        time.sleep(0.05)
        assert sent() == [1]
        time.sleep(WAKE_INTERVAL_S)
        step()  # due: wakes the sender, which sends both
        wait_sent([1, 2, 3])
        batches = [[m.step for m in b if isinstance(m, StepReport)] for b in sink.batches]
        assert [b for b in batches if b] == [[1], [2, 3]]  # one publisher send per wake-up
    finally:
        tel.close()


def test_a_long_steps_report_leaves_as_it_ends_though_the_timer_ran_meanwhile() -> None:
    """The sender's own timer running in the middle of a step does not hold that step's
    report back: its end wakes the sender once the last step-end wake-up is WAKE_INTERVAL_S
    old, whatever the timer did since (a rank killed by SIGKILL loses at most the report in
    hand)."""
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sent = lambda: [m.step for m in sink.sent if isinstance(m, StepReport)]  # noqa: E731
    try:
        tel.sampler._wake = 0.1  # the timer runs several times within the step below
        time.sleep(0.6)  # the thread is in its 0.1 s sleeps now
        tel.step_end(memory=MemoryBytes())
        deadline = time.monotonic() + 10.0
        while sent() != [1] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sent() == [1]
        time.sleep(WAKE_INTERVAL_S)  # a long step: the timer drains (nothing) meanwhile
        tel.sampler._wake = 60.0  # from its next sleep on, only a step end wakes it
        time.sleep(0.25)  # past the sleep it is in (0.2 s at most)
        tel.step_end(memory=MemoryBytes())
        while sent() != [1, 2] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert sent() == [1, 2]
    finally:
        tel.close()


def test_short_steps_wake_the_sender_about_once_per_wake_interval() -> None:
    """Steps ending every 30 ms for 3 s: the step ends wake the sender at most every
    WAKE_INTERVAL_S, and its own timer (as long) waits twice that after such a wake-up, so the
    two do not take turns: ~6 wake-ups, where taking turns made ~12 (the agent's overhead budget: the timer,
    started as the last wake-up's drain ended, mostly fires before the next due step end)."""
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=WAKE_INTERVAL_S)  # type: ignore[arg-type]
    drains = [0]
    drain = tel._outbox.drain

    def counted(*args: Any, **kwargs: Any) -> None:
        drains[0] += 1
        drain(*args, **kwargs)

    tel.sampler._drain = counted
    try:
        start = time.monotonic()
        while time.monotonic() - start < 3.0:
            tel.step_end(memory=MemoryBytes())
            time.sleep(0.03)
        elapsed = time.monotonic() - start
    finally:
        tel.close()
    assert 1 <= drains[0] <= elapsed / WAKE_INTERVAL_S + 2, (drains[0], elapsed)


def test_nothing_blocks_and_nothing_is_lost_silently_when_the_collector_is_gone() -> None:
    from tests.distributed import free_port

    publisher = Publisher(f"tcp://127.0.0.1:{free_port()}")  # nobody listens there
    tel = LiveTelemetry(publisher, sample_interval=60.0)
    for _ in range(EARLY_HOLD + 20):
        tel.collective(SleepyWork(), op="all_reduce", nbytes=8, group_size=2).wait()
        tel.step_end(memory=MemoryBytes())
        tel.drain()
    # The first EARLY_HOLD reports wait for a collector that may still come; every later one
    # is counted as dropped.
    assert publisher.sent == 0 and publisher.dropped == 20
    tel.close()


class StalledPublisher(Sink):
    """A publisher whose sends stall until released (a stuck sender thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.dropped = 0

    def send(self, message: Message) -> bool:
        if not isinstance(message, Bye):  # close's own Bye: a real send never blocks
            self.release.wait()
        return super().send(message)

    def count_dropped(self, n: int) -> None:
        self.dropped += n


def test_a_stalled_sender_never_blocks_the_loop_and_what_it_drops_is_counted() -> None:
    publisher = StalledPublisher()
    tel = LiveTelemetry(publisher, sample_interval=60.0)  # type: ignore[arg-type]
    steps = MAX_QUEUED + 40

    def loop() -> None:
        for _ in range(steps):
            tel.step_end(memory=MemoryBytes())

    tel.step_end(memory=MemoryBytes())  # the sender takes it and stalls in send
    assert wait_for_true(lambda: tel._outbox.queued == 0 or publisher.dropped > 0)
    training = threading.Thread(target=loop)
    training.start()
    training.join(timeout=120)
    assert not training.is_alive()  # a hang detector: step_end never waits for the sender
    publisher.release.set()
    tel.close()
    received = len(publisher.reports())
    assert publisher.dropped > 0 and received + publisher.dropped == steps + 1


def wait_for_true(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_close_never_hangs_on_a_sender_stuck_in_a_send() -> None:
    publisher = StalledPublisher()
    tel = LiveTelemetry(publisher, sample_interval=60.0)  # type: ignore[arg-type]
    tel.step_end(memory=MemoryBytes())
    tel.step_end(memory=MemoryBytes())
    assert wait_for_true(lambda: tel._outbox.queued <= 1)  # the sender took one and is stuck
    closing = threading.Thread(target=tel.close)
    closing.start()
    closing.join(timeout=60)
    try:
        assert not closing.is_alive()  # a hang detector: the exit goes on without the sender
        assert tel._outbox.errors >= 1  # and says it could not send what was left
    finally:
        publisher.release.set()  # let the stuck thread end


def test_block_marks_are_hooked_only_for_the_forwards_the_agent_counts() -> None:
    """The engine hooks its repeated blocks only when the agent counts a step's activations
    (steps 1-3, then every 10th): a module hook costs every call of its module. The split it
    measures has a known answer: a block of Linear(w, w) + GELU saves its input (for the
    matmul) and the Linear's output (for GELU), 2 * batch * w fp32 values, and takes a
    batch x w input."""
    from zeroscope.agent import api
    from zeroscope.engine.api import initialize

    batch, width, depth = 4, 8, 3
    hooked: list[int] = []  # per block call: the hooks on it then

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            hooked.append(len(self._forward_pre_hooks) + len(self._forward_hooks))
            return torch.nn.functional.gelu(self.fc(x))

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(depth))
            self.head = torch.nn.Linear(width, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return torch.nn.functional.mse_loss(self.head(x), y)

    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    api.set_telemetry(tel)
    try:
        torch.manual_seed(0)
        config = {"train_micro_batch_size_per_gpu": batch, "optimizer": {"type": "AdamW"}}
        eng, _, _, _ = initialize(model=Model(), config=config)
        x, y = torch.randn(batch, width), torch.randn(batch, 1)
        steps = 11
        for _ in range(steps):
            eng.backward(eng(x, y))
            eng.step()
        tel.close()
    finally:
        api.set_telemetry(None)
    counted = {1, 2, 3, 10}
    per_step = [hooked[i * depth : (i + 1) * depth] for i in range(steps)]
    assert per_step == [[2] * depth if s in counted else [0] * depth for s in range(1, 12)]
    reports = sink.reports()
    assert [r.step for r in reports] == list(range(1, steps + 1))
    value = 4  # fp32
    for r in reports:
        m = r.memory
        assert m.activations_layers == depth
        assert m.activations_layer_inputs == depth * batch * width * value
        assert m.activations_in_layers == depth * 2 * batch * width * value
        assert m.activations_layer_max == 2 * batch * width * value
        assert m.activations_step == max(s for s in counted if s <= r.step)
