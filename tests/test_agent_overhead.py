"""Tier 1: the mechanism that keeps the agent's cost on the training thread small (issue 18),
pinned without timing anything: the agent's own cost counters against the test's clock, no
Python callback per collective on CPU, encoding on another thread, nothing blocking when the
collector is gone. The cost itself is measured by ``bench/agent_overhead.py``."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator

import pytest

from tests.test_agent_timeline import Sink
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.schema import MemoryBytes


@pytest.fixture
def agent() -> Iterator[tuple[LiveTelemetry, Sink]]:
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    yield tel, sink
    tel.close()


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
        tel.step_end(memory=MemoryBytes())
        outside += time.perf_counter_ns() - t0
    cost = tel.cost
    assert (cost.steps, cost.collectives) == (3, 3)
    # Inside the caller's clock, and without the 2 x 20 ms per step the job spent.
    assert 0 < cost.collective_ns < cost.ns < outside - 3 * 0.04e9
    assert cost.per_step_us() is not None and cost.per_collective_us() is not None
    tel.close()
    reports = sink.reports()
    assert [r.step for r in reports] == [1, 2, 3]
    shares = [r.agent_overhead_s for r in reports]
    assert all(s is not None and s > 0 for s in shares)
    # Each report carries the time since the previous one: together, all but the last
    # step_end's own time.
    assert sum(s for s in shares if s is not None) * 1e9 == pytest.approx(cost.reported_ns, abs=10)
    assert cost.reported_ns < cost.ns


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


def test_the_cuda_path_still_stamps_completion_from_the_future(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from zeroscope.agent import comm

    monkeypatch.setattr(comm, "_cuda_event", lambda: object())
    tracker = comm.CollectiveTracker(cuda=True)
    works = [CountingWork() for _ in range(3)]
    for w in works:
        tracker.track(w, "all_reduce", 8, 2)
    assert [w.callbacks for w in works] == [1, 1, 1]  # one device event per op, as before


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
