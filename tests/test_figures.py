"""Tier 1: every derived figure of zeroscope.state against a known answer, on clusters built from
wire-schema messages: a compute straggler and a slow link under synchronous collectives (with
jitter), a known global batch and step rate, gradient accumulation, unreported P/G/O, and the
one definition of exposed % and of communication volume."""

from __future__ import annotations

import random

import msgspec
import pytest

from zeroscope.agent import schema
from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Collective,
    ConfigSummary,
    Hello,
    MemoryBytes,
    Message,
    ParamCounts,
    StepReport,
)
from zeroscope.state import ClusterState
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.state.prediction import predicted_traffic, traffic_elements
from zeroscope.state.report import run_report

NS = 10**9


def hellos(ranks: int, config: ConfigSummary | None = None) -> list[Message]:
    return [
        Hello(
            schema_version=SCHEMA_VERSION,
            job_id="known",
            rank=r,
            world_size=ranks,
            config=config,
            params=ParamCounts(total=1000, trainable=1000) if config else None,
        )
        for r in range(ranks)
    ]


def sync_run(
    ranks: int,
    steps: int,
    *,
    compute: dict[int, float] | None = None,
    link: dict[int, float] | None = None,
    from_step: int = 1,
    jitter: float = 0.01,
    seed: int = 0,
) -> list[Message]:
    """A run under synchronous collectives: each rank computes 200 ms (+ ``compute[r]`` from
    ``from_step``, + uniform jitter), then joins one all-reduce that takes 20 ms once the last
    rank arrived (+ ``link[r]`` on that rank's side only: its own slower link). A rank that
    arrives early waits for the last one inside the collective; every rank's step ends when its
    collective does."""
    rng = random.Random(seed)
    out = hellos(ranks)
    wall = [NS * 100] * ranks
    for step in range(1, steps + 1):
        c = {
            r: 0.2
            + (compute or {}).get(r, 0.0) * (step >= from_step)
            + rng.uniform(-jitter, jitter)
            for r in range(ranks)
        }
        last = max(c.values())
        for r in range(ranks):
            extra = (link or {}).get(r, 0.0) * (step >= from_step)
            comm = last - c[r] + 0.02 + extra  # waiting for the last rank, then the transfer
            duration = c[r] + comm
            wall[r] += int(duration * NS)
            out.append(
                StepReport(
                    rank=r,
                    step=step,
                    wall_ns=wall[r],
                    duration_s=duration,
                    collectives=[Collective("all_reduce", 4000, ranks, c[r], comm, comm)],
                    samples=4,
                    loss=1.0 + r,
                )
            )
    return out


def state_of(messages: list[Message]) -> ClusterState:
    state = ClusterState()
    for m in messages:
        state.ingest(m)
    state.flush()
    return state


def _ms(message: str) -> float:
    """The excess in an alert's detail ("r2 +97 ms compute per step ...")."""
    return float(message.split(" +")[1].split(" ms")[0])


def lag_alerts(state: ClusterState) -> dict[str, tuple[tuple[int, ...], int | None, str]]:
    return {
        a.kind: (a.ranks, a.first_step, a.message)
        for a in state.alerts()
        if a.kind in ("straggler", "slow_link", "exposed_comm")
    }


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_a_compute_straggler_is_named_alone_with_its_excess_and_onset(ranks: int) -> None:
    slow = ranks - 1
    state = state_of(sync_run(ranks, 20, compute={slow: 0.1}, from_step=6))
    alerts = lag_alerts(state)
    assert set(alerts) == {"straggler"}  # no slow link, and no exposed comm blamed on the rest
    named, since, message = alerts["straggler"]
    assert named == (slow,) and since == 6
    (finding,) = state.findings()
    assert finding.excess_s == pytest.approx(0.1, abs=0.015)
    assert finding.slowness == pytest.approx(1.5, abs=0.08)
    assert f"r{slow} +" in message and "compute per step" in message and "since step 6" in message
    assert _ms(message) == pytest.approx(100, abs=15)
    # Every rank's step time is the same; the waiting ranks are not "slow" for it.
    last = state.latest()
    assert last is not None and len({round(s.duration_s, 9) for s in last.summaries.values()}) == 1
    assert last.slowest_rank == slow and f"slowest r{slow} (+" in step_line(last)
    # A healthy rank against the median of the others: (0.3) for 2 ranks, (0.2, 0.3) for 3.
    expected = {2: 0.2 / 0.3, 3: 0.2 / 0.25, 8: 1.0}[ranks]
    assert state.slowness(0) == pytest.approx(expected, abs=0.08)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_step_one_rank_of_several_reported_names_no_slowest(ranks: int) -> None:
    """Under DDP's ``Join`` a rank with more batches runs steps the others do not: such a step
    (here the last rank's extra step, and a step whose other reports were dropped) has no peer
    for its one rank, which is then nobody's slowest; a world of one still names its rank."""
    messages = sync_run(ranks, 6, compute={0: 0.1}, from_step=1)
    last = ranks - 1
    dropped = [
        m for m in messages if not (isinstance(m, StepReport) and m.step == 4 and m.rank != last)
    ]
    extra = [m for m in messages if isinstance(m, StepReport) and m.step == 6 and m.rank == last]
    joined = msgspec.structs.replace(extra[0], step=7)
    state = state_of([*dropped, joined])
    one_rank = [state.steps[4], state.steps[7]]
    for agg in one_rank:
        assert list(agg.summaries) == [last] and agg.complete
        assert agg.slowest_rank is None and "slowest NA" in step_line(agg)
    assert state.steps[5].slowest_rank == 0  # the peered steps still name the slow rank
    alone = state_of(sync_run(1, 3))
    assert all(agg.slowest_rank == 0 for agg in alone.steps.values())


@pytest.mark.parametrize("ranks", [2, 3, 8])
def test_jitter_alone_names_nobody(ranks: int) -> None:
    state = state_of(sync_run(ranks, 40, jitter=0.015, seed=ranks))
    assert lag_alerts(state) == {}


def test_the_straggler_clears_when_it_recovers() -> None:
    messages = sync_run(3, 20, compute={1: 0.1}, from_step=3)
    recovered = [m for m in messages if not (isinstance(m, StepReport) and m.step > 10)]
    state = state_of(recovered + sync_run(3, 20, seed=1)[3:])  # steps 1..20 again: healthy
    assert "straggler" not in lag_alerts(state)


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_slow_link_is_named_apart_from_a_slow_compute_rank(ranks: int) -> None:
    state = state_of(sync_run(ranks, 20, link={0: 0.06}, from_step=4))
    alerts = lag_alerts(state)
    assert "straggler" not in alerts
    named, since, message = alerts["slow_link"]
    assert named == (0,) and since == 4 and "own collectives" in message
    assert _ms(message) == pytest.approx(60, abs=10)
    # Both at once: each named for what it is.
    state = state_of(sync_run(3, 20, compute={2: 0.1}, link={0: 0.06}, from_step=4))
    alerts = lag_alerts(state)
    assert alerts["straggler"][0] == (2,) and alerts["slow_link"][0] == (0,)


def test_known_global_batch_and_step_rate() -> None:
    # 3 ranks, 4 samples each (global batch 12), one step every 1/8.81 s.
    period = NS / 8.81
    out = hellos(3)
    for step in range(1, 31):
        for r in range(3):
            wall = int(NS * 100 + step * period)
            out.append(StepReport(rank=r, step=step, wall_ns=wall, duration_s=1 / 8.81, samples=4))
    state = state_of(out)
    steps_s, samples_s = state.throughput()
    assert steps_s == pytest.approx(8.81) and samples_s == pytest.approx(105.72)
    report = run_report(state)
    assert report["steps_per_s"] == pytest.approx(8.81)
    assert report["samples_per_s"] == pytest.approx(105.72)  # not 3 x 105.72 = 317
    assert "8.810 steps/s, 105.72 samples/s" in summary_lines(state)[1]
    assert report["samples_na"] == "" and not any("samples/s NA" in x for x in summary_lines(state))


def test_samples_not_reported_are_na_not_zero() -> None:
    state = state_of(
        hellos(2)
        + [StepReport(rank=r, step=s, wall_ns=s * NS, duration_s=1.0) for s in (1, 2) for r in (0, 1)]
    )  # fmt: skip
    steps_s, samples_s = state.throughput()
    assert steps_s == pytest.approx(1.0) and samples_s is None
    report = run_report(state)
    assert report["samples_per_s"] is None
    # Said with its reason, in the run's lines and in the report (a plain loop's samples).
    assert report["samples_na"].startswith("no rank reported its samples")
    assert f"samples/s NA: {report['samples_na']}" in summary_lines(state)


def test_exposed_percent_has_one_definition_everywhere() -> None:
    # r0 waits 100 ms for r1 plus a 20 ms transfer; r1 only the transfer. Steps of 320 ms.
    state = state_of(sync_run(2, 6, compute={1: 0.1}, jitter=0.0))
    last = state.latest()
    assert last is not None
    assert last.summaries[0].exposed_share == pytest.approx(0.12 / 0.32)
    assert last.summaries[1].exposed_share == pytest.approx(0.02 / 0.32)
    # The cluster's: the least-exposed rank's wait (the rest is waiting for the straggler).
    assert last.exposed_share == pytest.approx(0.02 / 0.32)
    assert "exposed   6%" in step_line(last)
    report = run_report(state)
    assert report["exposed_percent"] == pytest.approx(100 * 0.02 / 0.32)
    assert report["total"]["exposed_percent"] == report["exposed_percent"]
    assert report["ranks"][0]["exposed_percent"] == pytest.approx(100 * 0.12 / 0.32)
    assert "exposed comm 6%" in summary_lines(state)[1]


def test_volume_counts_an_all_reduce_twice_everywhere() -> None:
    state = state_of(sync_run(2, 3, jitter=0.0))
    rs = state.ranks[0]
    assert rs.summary is not None and rs.summary.comm_volume == 8000
    assert (
        rs.summary.ops["all_reduce"].volume == 8000 and rs.summary.ops["all_reduce"].nbytes == 4000
    )
    assert run_report(state)["ranks"][0]["comm_bytes_per_step"] == 8000


def test_loss_is_the_mean_of_the_ranks() -> None:
    state = state_of(sync_run(3, 4))
    last = state.latest()
    assert last is not None and last.loss == pytest.approx(2.0)  # ranks report 1, 2, 3
    assert "loss  2.0000" in step_line(last)
    assert "final loss 2.0000 (rank mean)" in summary_lines(state)[1]


def test_unreported_params_grads_optim_are_na() -> None:
    msg = StepReport(rank=0, step=1, wall_ns=NS, duration_s=1.0, memory=MemoryBytes(activations=5))
    decoded = schema.decode(schema.encode(msg))
    assert isinstance(decoded, StepReport)
    assert (decoded.memory.params, decoded.memory.grads, decoded.memory.optim) == (None,) * 3
    state = state_of([*hellos(1), decoded])
    last = state.latest()
    assert last is not None
    assert "P NA G NA O NA A 5B" in step_line(last)
    row = run_report(state)["ranks"][0]
    assert (row["params_peak"], row["grads_peak"], row["optim_peak"]) == (None, None, None)
    # Reported as 0 it is 0 (held, none), all the way to the line and the report: the NA above
    # is the absence of a figure, not a 0 read as missing.
    zero = StepReport(rank=0, step=1, wall_ns=NS, duration_s=1.0, memory=MemoryBytes(params=0))
    again = schema.decode(schema.encode(zero))
    assert isinstance(again, StepReport) and again.memory.params == 0
    held = state_of([*hellos(1), again])
    last = held.latest()
    assert last is not None and "P 0B G NA" in step_line(last)
    assert run_report(held)["ranks"][0]["params_peak"] == 0


def _config(stage: int, gas: int, **kw: object) -> ConfigSummary:
    return ConfigSummary(
        stage=stage, precision="bf16", dp_world_size=4, gradient_accumulation_steps=gas, **kw
    )  # type: ignore[arg-type]


def test_predicted_traffic_follows_the_engine_not_only_the_paper() -> None:
    psi = ParamCounts(total=1000, trainable=1000, padded_total=1000)
    # Stages 0-1 reduce once per step whatever the accumulation; stage 2 every micro-batch.
    assert traffic_elements(_config(0, 4), psi)[0] == 2000
    assert traffic_elements(_config(1, 4), psi)[0] == 2000
    assert traffic_elements(_config(2, 1), psi)[0] == 2000
    assert traffic_elements(_config(2, 2), psi)[0] == 3000  # the paper's 2Ψ read 1.50x here
    # Stage 3, nothing persistent. Default reuse keeps forward's gathers for backward: per
    # micro-batch Ψ gathered + Ψ reduce-scattered; without reuse 2Ψ + Ψ (the paper's 3Ψ).
    assert traffic_elements(_config(3, 1), psi)[0] == 2000
    assert traffic_elements(_config(3, 1, max_reuse_distance=0), psi)[0] == 3000
    assert traffic_elements(_config(3, 2, max_reuse_distance=0), psi)[0] == 6000
    # Reuse within 400 elements keeps the last 200 of 1000: gathers 1.8Ψ per micro-batch.
    assert traffic_elements(_config(3, 1, max_reuse_distance=400), psi)[0] == 2800
    # Persistent parameters are never gathered per micro-batch, refreshed once per step.
    persistent = ParamCounts(total=1000, trainable=1000, padded_total=1000, persistent=300)
    assert traffic_elements(_config(3, 2, max_reuse_distance=0), persistent)[0] == (
        2 * (700 * 2 + 1000) + 300
    )
    state = state_of(hellos(4, _config(2, 2)))
    predicted = predicted_traffic(state)
    assert predicted is not None
    assert predicted.volume == 3000 * 2 and predicted.paper == 2000 * 2  # bf16: 2 bytes


def test_series_take_the_median_rank_of_each_step() -> None:
    from zeroscope.state.history import busbw_series, median_rank_series, rank_series

    # r1 waits 100 ms for r2 at 3 ranks: durations per rank 0.32 (r0, r1) and 0.32 (r2).
    state = state_of(sync_run(3, 4, compute={2: 0.1}, jitter=0.0))
    waits = median_rank_series(state, lambda s: s.exposed_s)
    assert waits == pytest.approx([0.12] * 4)  # the median of 0.12, 0.12, 0.02
    assert rank_series(state, 2, lambda s: s.exposed_s) == [
        (step, pytest.approx(0.02)) for step in (1, 2, 3, 4)
    ]
    # all-reduce of 4000 B among 3 ranks in 0.12 s: busbw = 4000 / 0.12 x 2 x 2/3.
    assert busbw_series(state, "all_reduce")[0] == pytest.approx(4000 / 0.12 * 4 / 3)
    assert busbw_series(state, "all_gather") == [None] * 4
