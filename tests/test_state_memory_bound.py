"""A view of a large job keeps a bounded number of rank-steps of summaries: each rank's
history and each kept step's reports hold the same summaries, and 512 steps of 16,384 ranks
grew a viewer by ~13 GB. Past the budget a job keeps fewer steps of them (never fewer than
the alerts' and the advice's windows need); the cluster's series keeps every point, and the
steps kept read exactly as they do in a view that keeps them all."""

from __future__ import annotations

import msgspec
import pytest

from tests.fixtures import RunShape, synthetic_run
from zeroscope.agent.schema import Hello
from zeroscope.state import ClusterState
from zeroscope.state import rank as rank_module
from zeroscope.state.rank import HISTORY_STEPS, MIN_STEPS_KEPT, steps_kept


def test_steps_kept_by_the_jobs_size() -> None:
    budget = rank_module.RANK_STEPS_KEPT
    assert steps_kept(1) == steps_kept(budget // HISTORY_STEPS) == HISTORY_STEPS
    assert steps_kept(4096) == budget // 4096 < HISTORY_STEPS
    assert steps_kept(16_384) == steps_kept(10**6) == MIN_STEPS_KEPT == 64
    assert steps_kept(8, history_steps=40) == 40
    # Every window read from the kept steps fits: the advice's 32, the alerts' defaults.
    from zeroscope.state import AlertRules
    from zeroscope.state.advice.facts import WINDOW

    rules = AlertRules()
    assert max(WINDOW + 1, rules.storm_window, rules.straggler_window) <= MIN_STEPS_KEPT


def test_a_large_job_keeps_fewer_steps_and_the_kept_ones_read_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 8 ranks stand for a large job: a budget of 8 x 70 rank-steps keeps 70 steps of 100.
    monkeypatch.setattr(rank_module, "RANK_STEPS_KEPT", 8 * 70)
    run = synthetic_run(RunShape(ranks=8, steps=100, straggle_from=50))
    bounded, whole = ClusterState(), ClusterState()
    bounded.ingest_all(run)
    monkeypatch.setattr(rank_module, "RANK_STEPS_KEPT", 1 << 30)
    whole.ingest_all(run)

    assert bounded.kept_steps == 70 and whole.kept_steps == HISTORY_STEPS
    assert [len(rs.history) for rs in bounded.ranks.values()] == [70] * 8
    assert list(bounded.steps) == list(whole.steps)[-70:]
    # What is kept reads as in the view that keeps everything.
    for step, agg in bounded.steps.items():
        other = whole.steps[step]
        assert agg.summaries == other.summaries and agg.standings == other.standings
        assert (agg.step_time, agg.loss, agg.exposed_share) == (
            other.step_time,
            other.loss,
            other.exposed_share,
        )
    for r, rs in bounded.ranks.items():
        assert list(rs.history) == list(whole.ranks[r].history)[-70:]
        assert rs.totals == whole.ranks[r].totals  # the run's totals cover every step
    assert list(bounded.series.points) == list(whole.series.points)  # every step's point
    assert len(bounded.series.points) == 100
    assert bounded.findings() == whole.findings() and bounded.alerts(0) == whole.alerts(0)


def test_a_world_said_larger_later_shortens_what_is_held(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_module, "RANK_STEPS_KEPT", 4 * 200)
    run = synthetic_run(RunShape(ranks=4, steps=150))
    state = ClusterState()
    state.ingest_all(run)
    assert state.kept_steps == 200 and len(state.ranks[0].history) == 150
    # A Hello that says the job has 8 ranks (another node joins): 100 steps kept from now on.
    hello = next(m for m in run if isinstance(m, Hello) and m.rank == 0)
    state.ingest(msgspec.structs.replace(hello, world_size=8))
    assert state.kept_steps == 100
    assert [len(rs.history) for rs in state.ranks.values()] == [100] * 4
    assert len(state.steps) == 100 and state.ranks[0].history.maxlen == 100
