"""The live viewer's receive clock (zeroscope/state/clock.py) is wall seconds that are never
stepped: the "rank silent" alert measures silence on it, so setting the wall clock (NTP's step,
a VM or a laptop resumed) neither makes every rank silent nor hides one that went quiet. The
stepped wall clock is injected (``time.time`` moved an hour); the independent clock is the
monotonic one."""

from __future__ import annotations

import time

import pytest

from zeroscope.agent.schema import SCHEMA_VERSION, Heartbeat, Hello
from zeroscope.commands.run import _fold_steps
from zeroscope.state import ClusterState
from zeroscope.state.clock import receive_now

STEP_S = 3600.0


def _silent(state: ClusterState, now_s: float) -> tuple[int, ...]:
    return next((a.ranks for a in state.alerts(now_s) if a.kind == "silent"), ())


def _job(ranks: int = 2) -> ClusterState:
    """A live job's state, each rank heard from just now (the headless view's own fold)."""
    state = ClusterState()
    messages: list = [
        Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=r, world_size=ranks)
        for r in range(ranks)
    ]
    messages += [Heartbeat(rank=r, step=0, wall_ns=time.time_ns()) for r in range(ranks)]
    _fold_steps(state, messages)
    return state


def test_the_receive_clock_follows_the_monotonic_clock_not_the_wall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m0 = time.monotonic()
    r0 = receive_now()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + STEP_S)
    time.sleep(0.05)
    r1 = receive_now()
    m1 = time.monotonic()
    # Read inside the monotonic pair: no more than it moved (the step left it alone).
    assert 0.05 <= r1 - r0 <= m1 - m0 + 1e-6


def test_a_wall_clock_stepped_forward_makes_no_rank_silent(monkeypatch: pytest.MonkeyPatch) -> None:
    state = _job()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + STEP_S)
    assert _silent(state, receive_now()) == ()
    assert _silent(state, time.time()) == (0, 1)  # what the wall clock would have said


def test_a_wall_clock_stepped_back_hides_no_silent_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live fold stamps arrivals on the receive clock: after the wall clock went back an
    hour, a rank that then falls silent is still called silent once the threshold passes."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - STEP_S)
    state = _job()
    seen = [rs.last_seen_s for rs in state.ranks.values()]
    assert all(s is not None and abs(s - receive_now()) < 1.0 for s in seen)
    later = receive_now() + state.rules.silent_s + 1.0
    assert _silent(state, later) == (0, 1)
