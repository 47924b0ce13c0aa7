"""The history plots' series (zeroscope.state.history.StepSeries) against runs whose answer is
known by construction: each rank computes 200 ms, one all-reduce of 20 ms once the last rank
arrived (tests/test_figures.py:sync_run)."""

from __future__ import annotations

import statistics

import pytest

from tests.fixtures import RunShape, synthetic_run
from tests.test_figures import state_of, sync_run
from zeroscope.state import ClusterState
from zeroscope.state.history import rank_beside_cluster


def test_step_time_median_and_slowest_with_the_straggler_steps_marked() -> None:
    # r2 computes 100 ms longer from step 6 on; no jitter: every figure is exact.
    state = state_of(sync_run(3, 10, compute={2: 0.1}, from_step=6, jitter=0.0))
    points = list(state.series.points)
    assert [p.step for p in points] == list(range(1, 11))
    # Synchronous collectives: every rank's step ends with the slowest: 200 (+100) + 20 ms.
    assert [p.step_time for p in points] == pytest.approx([0.22] * 5 + [0.32] * 5)
    assert [p.median_time for p in points] == pytest.approx([0.22] * 5 + [0.32] * 5)
    # The straggler's excess (100 ms) is over max(10 ms, 10 % of 320 ms) from step 6 on; the
    # flag stands from its third over-step (3 of 5), and marks the streak back to step 6.
    assert [p.straggler for p in points] == [None] * 5 + [2] * 5
    state = state_of(sync_run(3, 7, compute={2: 0.1}, from_step=6, jitter=0.0))
    assert [p.straggler for p in state.series.points] == [None] * 7  # 2 over-steps: no flag
    # Exposed: the cluster's is the least-exposed rank's wait (r2: 20 ms of 320); the median
    # rank waited 100 + 20 ms.
    assert points[-1].exposed == pytest.approx(0.02 / 0.32)
    assert points[-1].median_exposed == pytest.approx(0.12 / 0.32)


def test_memory_is_the_largest_rank_by_part_and_loss_the_rank_mean() -> None:
    shape = RunShape(ranks=4, steps=6, offload_optimizer="cpu")
    messages = synthetic_run(shape)
    state = ClusterState()
    state.ingest_all(messages)
    reports = [m for m in messages if getattr(m, "memory", None) is not None and m.step == 5]  # type: ignore[attr-defined]
    totals = {
        r.rank: r.memory.params + r.memory.grads + r.memory.optim + r.memory.activations
        for r in reports
    }  # type: ignore[attr-defined]
    biggest = max(totals, key=lambda r: totals[r])
    p = state.series.at(5)
    assert p is not None and p.memory_rank == biggest
    m = next(r.memory for r in reports if r.rank == biggest)  # type: ignore[attr-defined]
    assert (p.params, p.grads, p.optim, p.activations) == (
        m.params,
        m.grads,
        m.optim,
        m.activations,
    )
    assert p.host == m.host_grads + m.host_optim and p.host > 0
    assert p.median_memory == statistics.median(totals.values())
    losses = [r.loss for r in reports]  # type: ignore[attr-defined]
    assert p.loss == pytest.approx(sum(losses) / len(losses))
    bws = sorted(
        sum(t.nbytes for t in r.transfers) / sum(t.duration_s for t in r.transfers) for r in reports
    )  # type: ignore[attr-defined]
    assert p.offload_bw == pytest.approx(statistics.median(bws))


def test_a_rank_beside_the_cluster_median_is_aligned_by_step() -> None:
    state = state_of(sync_run(3, 8, compute={2: 0.1}, from_step=4, jitter=0.0))
    steps, mine, cluster = rank_beside_cluster(
        state, 2, lambda s: s.exposed_share, lambda p: p.median_exposed
    )
    assert steps == list(range(1, 9))
    assert mine == pytest.approx([0.02 / 0.22] * 3 + [0.02 / 0.32] * 5)
    assert cluster == pytest.approx([0.02 / 0.22] * 3 + [0.12 / 0.32] * 5)
    assert rank_beside_cluster(state, 99, lambda s: s.loss, lambda p: p.loss) == ([], [], [])


def test_the_series_keeps_the_last_history_steps_and_freezes_closed_steps() -> None:
    state = ClusterState(history_steps=4)
    messages = sync_run(2, 10, jitter=0.0)
    state.ingest_all(messages)
    assert [p.step for p in state.series.points] == [7, 8, 9, 10]
    version, before = state.series.version, state.series.at(9)
    # A report of step 9 arriving again after the step closed changes no plotted figure.
    late = next(m for m in messages if getattr(m, "step", None) == 9)
    state.ingest(late)
    assert state.series.version == version and state.series.at(9) == before
    assert state.series.at(3) is None
