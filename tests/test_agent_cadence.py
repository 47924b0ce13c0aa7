"""Tier 1: which forwards have their activations counted (agent/cadence.py), on the test's
own clock: the step rule, the time floor, and a wait set by what a count really cost."""

from __future__ import annotations

import time
from typing import Any

import pytest

from zeroscope.agent import cadence
from zeroscope.agent.schema import MemoryBytes


def test_activations_are_counted_every_nth_step_and_by_default_at_most_once_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counting costs a call per saved tensor: by default steps 1-3, then every 10th step at
    least a second after the last count (27 ms steps: 1, 2, 3, 10, 50, 90); a period set in
    the environment is taken exactly, with no time floor."""
    from zeroscope.agent import cadence

    clock = [0.0]
    monkeypatch.setattr(cadence.time, "monotonic", lambda: clock[0])

    def counted(c: cadence.ActivationCadence) -> list[int]:
        out = []
        for step in range(1, 101):
            clock[0] += 0.027
            if c.due(step, counting=False):
                out.append(step)
                assert c.due(step, counting=True)  # the step's next micro-batch too
        return out

    monkeypatch.delenv(cadence.ACTIVATIONS_EVERY_ENV, raising=False)
    assert counted(cadence.ActivationCadence.from_env()) == [1, 2, 3, 10, 50, 90]
    monkeypatch.setenv(cadence.ACTIVATIONS_EVERY_ENV, "4")
    assert counted(cadence.ActivationCadence.from_env()) == [1, 2, 3, *range(4, 101, 4)]
    monkeypatch.setenv(cadence.ACTIVATIONS_EVERY_ENV, "zero")  # unreadable: the default
    assert counted(cadence.ActivationCadence.from_env())[:4] == [1, 2, 3, 10]


def test_a_costly_count_waits_until_its_cost_is_a_tenth_of_a_percent_of_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A deep model's counted step costs milliseconds of hooks: 5 ms of counting waits 5 s
    (cadence.COUNT_BUDGET), whatever the step rule says; a cheap count keeps the 1 s floor.
    A period set in the environment is still taken exactly."""
    from zeroscope.agent import cadence

    clock = [0.0]
    monkeypatch.setattr(cadence.time, "monotonic", lambda: clock[0])
    monkeypatch.delenv(cadence.ACTIVATIONS_EVERY_ENV, raising=False)
    c = cadence.ActivationCadence.from_env()
    out = []
    for step in range(1, 401):
        clock[0] += 0.125  # exact in binary: the floors fall on steps
        if c.due(step, counting=False):
            out.append(step)
            c.spent(0.005 if step >= 10 else 0.0001)  # counting grew costly from step 10 on
    # 10 (at 1.25 s) costs 5 ms: each next count is the first 10th step 5 s later.
    assert out == [1, 2, 3, 10, *range(50, 401, 40)]
    exact = cadence.ActivationCadence(every=4)
    exact.spent(1.0)
    assert [s for s in range(4, 13) if exact.due(s, counting=False)] == [4, 8, 12]


def test_a_counted_steps_excess_over_the_recent_plain_steps_sets_the_wait() -> None:
    """The counters see only part of what a count costs: a counted step 8 ms slower than the
    median of the plain steps before it waits 8 s; a slow plain step does not move the
    baseline, a counted step no slower than usual keeps the wait the counters set, and a
    counted step slowed by a hiccup waits at most MAX_WAIT_S."""
    c = cadence.ActivationCadence.from_env()
    ms = 1_000_000
    for plain in (20, 21, 19, 95, 20):  # one plain step hit by something else
        c.observe(plain * ms, counted=False)
    c.spent(0.001)  # the counters said 1 ms
    assert c._wait_s == pytest.approx(1.0)
    c.observe(None, counted=True)  # no forward in the step: nothing learnt
    c.observe(28 * ms, counted=True)  # 8 ms over the median, 20 ms
    assert c._wait_s == pytest.approx(8.0)
    c.spent(0.001)
    c.observe(19 * ms, counted=True)  # no slower: the counters' wait stands
    assert c._wait_s == pytest.approx(1.0)
    c.observe(10_000 * ms, counted=True)
    assert c._wait_s == cadence.MAX_WAIT_S
    exact = cadence.ActivationCadence(every=4)  # a period set in the environment: exact
    exact.observe(20 * ms, counted=False)
    exact.observe(900 * ms, counted=True)
    assert [s for s in range(4, 13) if exact.due(s, counting=False)] == [4, 8, 12]


def test_the_live_agent_learns_a_counts_cost_from_the_steps_it_reports(
    agent: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Injected: every counted forward of this job takes 30 ms longer (the counters see none
    of it). After the first count past step 3 the sender has measured it and the next count
    waits ~30 s of the run (COUNT_BUDGET), not the 1 s floor."""
    tel, sink = agent
    clock = [0.0]
    tel._cadence.clock = lambda: clock[0]
    counted = []
    for step in range(1, 41):
        clock[0] += 0.5
        with tel.phase("forward"):
            if tel._counting:
                counted.append(step)
                time.sleep(0.03)
            time.sleep(0.002)
        tel.step_end(memory=MemoryBytes())
        tel.drain()  # the sender's turn: it makes the step's axis and observes it
    # Steps 1-3, then 10 (5 s in); 30 s later is past step 40: no count at 20 or 30.
    assert counted == [1, 2, 3, 10]
    assert 25.0 <= tel._cadence._wait_s <= 45.0
    assert [r.step for r in sink.reports()] == list(range(1, 41))


def test_the_attach_counts_memory_on_the_activation_rule_and_at_once_on_a_layout_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The attach's census of P/G/O (agent/attach/session.py): steps 1-3, then every 10th step
    at least a second apart (27 ms steps: 10, 50, 90), at once when the optimizer state
    changed size; G (before the optimizer step) and P/O (after it) on the same steps; a
    period set in ``ZEROSCOPE_MEMORY_EVERY`` taken exactly."""
    from zeroscope.agent.attach import session

    monkeypatch.delenv(session.MEMORY_EVERY_ENV, raising=False)

    class Reader(session.EngineReader):
        state = 0

        def layout(self) -> Any:
            return self.state

    def counted(s: session.AttachSession, reader: Reader, grow_at: int = 0) -> list[int]:
        clock = [0.0]
        s.memory_cadence.clock = lambda: clock[0]
        s.reader = reader
        out = []
        for step in range(1, 101):
            clock[0] += 0.027
            if step == grow_at:
                reader.state += 1  # e.g. a second param group's state created lazily
            due = s._memory_due()
            assert s._memory_due() == due  # asked again after the optimizer step: the same
            if due:
                out.append(step)
                s._layout = (id(reader), reader.layout())
            s.steps += 1
        return out

    assert counted(session.AttachSession(), Reader()) == [1, 2, 3, 10, 50, 90]
    assert counted(session.AttachSession(), Reader(), grow_at=33) == [1, 2, 3, 10, 33, 50, 90]
    monkeypatch.setenv(session.MEMORY_EVERY_ENV, "7")
    assert counted(session.AttachSession(), Reader()) == [1, 2, 3, *range(7, 101, 7)]
