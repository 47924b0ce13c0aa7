"""Tier 1: the mechanism that keeps the agent's cost on the training thread small (issue 18),
pinned without timing anything: the agent's own cost counters against the test's clock, no
Python callback per collective on CPU, encoding on another thread, nothing blocking when the
collector is gone. The cost itself is measured by ``bench/agent_overhead.py``."""

from __future__ import annotations

import time
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
