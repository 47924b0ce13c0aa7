"""The alerts' per-rank conditions kept as messages arrive (state/conditions.py) and the header's
cached mesh equal an independent full recomputation over every rank, through ranks that go
silent, come back, run low on memory, drop messages, exit (cleanly, with an error, stopped from
outside) and say Bye twice; with receive times in order, out of order, and replay's own."""

from __future__ import annotations

import random

import pytest

from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Bye,
    Heartbeat,
    Hello,
    HostSample,
    ParallelLayout,
    StepReport,
)
from zeroscope.state import AlertRules, ClusterState
from zeroscope.state.alerts import interrupted
from zeroscope.state.mesh import mesh_shape
from zeroscope.state.roster import missing_of

BASE_NS = 1_700_000_000 * 10**9
RANKS = 48
PER_RANK_KINDS = ("memory", "silent", "exited", "lost", "drops")


def _reference(state: ClusterState, now_s: float) -> dict[str, tuple[int, ...]]:
    """The per-rank alerts' ranks by a pass over every rank's state, as the alerts found them
    before the conditions were kept (the same comparisons, written out apart)."""
    rules = state.rules
    low, silent, failed, dropping, ended = [], [], [], [], False
    for r, rs in state.ranks.items():
        host = rs.host
        if host is not None:
            total, used = host.gpu_mem_total_bytes, host.gpu_mem_used_bytes
            if (total and used is not None and (total - used) / total < rules.headroom_min) or (
                host.mem_available_bytes is not None
                and host.mem_available_bytes < rules.host_available_min
            ):
                low.append(r)
        if rs.bye is None:
            if rs.last_seen_s is not None and now_s - rs.last_seen_s > rules.silent_s:
                silent.append(r)
        else:
            ended = True
            if rs.bye.exit_code != 0 and not interrupted(rs.bye.message):
                failed.append(r)
        if rs.dropped:
            dropping.append(r)
    oom = {e.rank for e in state.events if e.event == "oom_warning"}
    lost: list[int] = []
    if ended:
        lost = [r for r, rs in state.ranks.items() if rs.bye is None] if failed else silent
    found = {
        "memory": sorted(set(low) | oom),
        "silent": sorted(silent),
        "exited": sorted(failed),
        "lost": sorted(lost),
        "drops": sorted(dropping),
    }
    return {kind: tuple(ranks) for kind, ranks in found.items() if ranks}


def _shown(state: ClusterState, now_s: float) -> dict[str, tuple[int, ...]]:
    return {a.kind: a.ranks for a in state.alerts(now_s) if a.kind in PER_RANK_KINDS}


def _check(state: ClusterState) -> None:
    """Compare at instants around every rank's silence threshold, where an off-by-one in the
    early stop would show."""
    silent_s = state.rules.silent_s
    instants = {state.clock_s, state.clock_s + 0.5, state.clock_s + 100.0}
    instants |= {rs.last_seen_s + silent_s for rs in state.ranks.values() if rs.last_seen_s}
    instants |= {rs.last_seen_s + 1.5 for rs in state.ranks.values() if rs.last_seen_s}
    for now in sorted(instants):
        assert _shown(state, now) == _reference(state, now), now


def _host(rng: random.Random) -> HostSample:
    return rng.choice(
        [
            HostSample(gpu_mem_total_bytes=80 * 10**9, gpu_mem_used_bytes=78 * 10**9),
            HostSample(gpu_mem_total_bytes=80 * 10**9, gpu_mem_used_bytes=10 * 10**9),
            HostSample(mem_available_bytes=10**8),
            HostSample(mem_available_bytes=10**11),
            HostSample(),
        ]
    )


def _bye(rng: random.Random, rank: int, step: int) -> Bye:
    code, text = rng.choice([(0, ""), (1, "RuntimeError: boom"), (143, "SIGTERM from launcher")])
    return Bye(rank=rank, step=step, wall_ns=BASE_NS, exit_code=code, message=text)


def _message(rng: random.Random, rank: int, step: int) -> StepReport | Heartbeat | Bye:
    wall = BASE_NS + step * 10**9
    kind = rng.random()
    if kind < 0.5:
        host = _host(rng) if rng.random() < 0.3 else None
        dropped = rng.choice([0, 0, 0, 2])
        return StepReport(
            rank=rank, step=step, wall_ns=wall, duration_s=1.0, host=host, dropped=dropped
        )
    if kind < 0.9:
        host = _host(rng) if rng.random() < 0.6 else None
        return Heartbeat(
            rank=rank, step=step, wall_ns=wall, dropped=rng.choice([0, 0, 1]), host=host
        )
    return _bye(rng, rank, step)


def _hellos(ranks: int) -> list[Hello]:
    return [
        Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=r, world_size=ranks, node_rank=r // 8)
        for r in range(ranks)
    ]


@pytest.mark.parametrize("clock", ["in order", "out of order", "replay"])
def test_kept_conditions_equal_a_pass_over_every_rank(clock: str) -> None:
    rng = random.Random(f"conditions-{clock}")
    state = ClusterState()
    for hello in _hellos(RANKS):
        state.ingest(hello, None if clock == "replay" else 0.0)
    t = 0.0
    for step in range(60):
        # A few ranks each round: the rest fall silent and come back later.
        for rank in rng.sample(range(RANKS), rng.randint(1, RANKS // 3)):
            t += rng.uniform(0.0, 0.4)
            received = t
            if clock == "out of order" and rng.random() < 0.2:
                received = t - rng.uniform(0.0, 5.0)  # a caller's clock that goes back
            message = _message(rng, rank, step)
            state.ingest(message, None if clock == "replay" else received)
        _check(state)
    assert state.conditions.byes, "the run should have ended some ranks"


def test_a_rank_silent_then_back_and_a_second_bye() -> None:
    state = ClusterState()
    for hello in _hellos(4):
        state.ingest(hello, 0.0)
    for r in range(4):
        state.ingest(Heartbeat(rank=r, step=0, wall_ns=BASE_NS), 1.0 + r)
    assert _shown(state, 5.5) == _reference(state, 5.5) == {"silent": (0, 1, 2)}
    state.ingest(Heartbeat(rank=0, step=1, wall_ns=BASE_NS), 5.0)  # rank 0 is back
    assert _shown(state, 5.5) == _reference(state, 5.5) == {"silent": (1, 2)}
    state.ingest(Bye(rank=1, step=1, wall_ns=BASE_NS, exit_code=1, message="x"), 6.0)
    # A peer failed: every rank without a Bye is lost, silent or not.
    assert _shown(state, 6.0) == _reference(state, 6.0)
    assert _shown(state, 6.0)["lost"] == (0, 2, 3)
    state.ingest(Bye(rank=1, step=2, wall_ns=BASE_NS, exit_code=0), 7.0)  # replaces the first
    state.ingest(Heartbeat(rank=1, step=2, wall_ns=BASE_NS), 8.0)  # after its Bye: not silent
    for now in (7.0, 9.0, 10.5, 20.0):
        assert _shown(state, now) == _reference(state, now)
    assert "exited" not in _shown(state, 20.0)


def test_changed_memory_thresholds_are_judged_again() -> None:
    state = ClusterState()
    tight = HostSample(gpu_mem_total_bytes=100, gpu_mem_used_bytes=85)
    state.ingest(Heartbeat(rank=0, step=0, wall_ns=BASE_NS, host=tight), 0.0)
    assert _shown(state, 0.0) == _reference(state, 0.0) == {}
    state.rules.headroom_min = 0.2
    assert _shown(state, 0.0) == _reference(state, 0.0) == {"memory": (0,)}
    state.rules = AlertRules(headroom_min=0.05)
    assert _shown(state, 0.0) == _reference(state, 0.0) == {}


def test_the_cached_mesh_follows_the_hellos() -> None:
    state = ClusterState()
    hellos = _hellos(16)
    for hello in hellos:
        state.ingest(hello, 0.0)
    assert state.mesh_shape() is None
    layout = ParallelLayout(pp=1, pp_size=2, dp_size=8, schedule="Schedule1F1B", microbatches=4)
    # Rank 5 says Hello again with its layout: the search runs again.
    state.ingest(Hello(**{**_fields(hellos[5]), "parallel": layout}), 1.0)
    expected = mesh_shape(rs.hello for rs in state.ranks.values())
    assert expected is not None and state.mesh_shape() == expected
    state.ingest(Hello(**{**_fields(hellos[5]), "parallel": None}), 2.0)
    assert state.mesh_shape() == mesh_shape(rs.hello for rs in state.ranks.values()) is None


def _fields(hello: Hello) -> dict[str, object]:
    return {f: getattr(hello, f) for f in hello.__struct_fields__}


def test_the_cached_none_missing_follows_the_ranks_and_the_world() -> None:
    state = ClusterState()
    hellos = _hellos(8)

    def same() -> list[tuple[int, ...]]:
        found = [g.ranks for g in state.missing()]
        assert found == [g.ranks for g in missing_of(state)]
        return found

    for hello in hellos[:7]:
        state.ingest(hello, 0.0)
    assert same() == [(7,)]
    state.ingest(hellos[7], 0.0)
    assert same() == [] and same() == []  # the second answer is the cached one
    state.ingest(Heartbeat(rank=9, step=0, wall_ns=BASE_NS), 1.0)  # a rank past the world
    assert same() == []
    state.ingest(Hello(**{**_fields(hellos[0]), "world_size": 12}), 2.0)  # the world grew
    assert same() == [(8, 10, 11)]
