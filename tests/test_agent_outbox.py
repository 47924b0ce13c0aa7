"""Short steps lose no report between two of the sender's wake-ups (agent/outbox.py).

The training thread wakes the sender at most every ``WAKE_INTERVAL_S``; the hand-off queue
drops its oldest item past ``MAX_QUEUED``. A job whose steps take under 2 ms (a small model on
gloo on a quiet machine) handed over more than ``MAX_QUEUED`` reports between two timed
wake-ups, and steps 2-44 of a 300-step run never reached the headless view. The test freezes
the outbox's clock (every step ends within one wake interval: steps as short as they come) and
plays the sender thread itself, draining exactly when it is woken, so the answer does not
depend on how fast this machine runs the loop.
"""

from __future__ import annotations

import time

from tests.test_agent_timeline import Sink
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.outbox import MAX_QUEUED, Outbox
from zeroscope.agent.schema import MemoryBytes, StepReport


class CountingSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def count_dropped(self, n: int) -> None:
        self.dropped += n


def test_steps_faster_than_the_wake_interval_lose_no_report() -> None:
    sink = CountingSink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    tel.sampler.stop()  # this test is the sender thread: it drains when, and only when, woken
    outbox = tel._outbox
    outbox.wake.clear()
    frozen = time.perf_counter_ns()  # every step ends within one WAKE_INTERVAL_S of the first

    def put(item: object, now_ns: int | None = None) -> None:
        Outbox.put(outbox, item, frozen)  # type: ignore[arg-type]

    outbox.put = put  # type: ignore[method-assign]
    steps = 3 * MAX_QUEUED
    wakes = 0
    for _ in range(steps):
        tel.step_end(memory=MemoryBytes())
        if outbox.wake.is_set():
            outbox.wake.clear()
            wakes += 1
            outbox.drain()
    assert outbox.lost == 0 and sink.dropped == 0
    tel.close()
    assert [m.step for m in sink.sent if isinstance(m, StepReport)] == list(range(1, steps + 1))
    # Woken by the queue's depth, not per step: a wake-up costs the run more than a step's
    # reports (agent/cost.py).
    assert 1 < wakes <= steps // 32, wakes
