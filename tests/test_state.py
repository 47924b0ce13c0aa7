"""ClusterState: aggregation, stragglers, alerts and the headless lines, on schema messages."""

from __future__ import annotations

import math
import statistics

import pytest

from tests.fixtures import BASE_NS, RunShape, synthetic_run
from zeroscope.agent.schema import (
    Bye,
    Collective,
    Event,
    HostSample,
    MemoryBytes,
    StepReport,
)
from zeroscope.state import AlertRules, ClusterState
from zeroscope.state.bandwidth import busbw
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.state.report import run_report


def _state(shape: RunShape | None = None, until_step: int | None = None) -> ClusterState:
    state = ClusterState()
    for m in synthetic_run(shape):
        if until_step is not None and getattr(m, "step", -1) > until_step:
            break
        state.ingest(m)
    return state


def _kinds(state: ClusterState, now: float | None = None) -> set[str]:
    return {a.kind for a in state.alerts(now)}


def test_fixture_run_aggregates_every_rank_and_step() -> None:
    state = _state()
    assert state.world_size == 4 and sorted(state.ranks) == [0, 1, 2, 3]
    assert state.config is not None and state.config.stage == 3
    done = state.complete_steps()
    assert [a.step for a in done] == list(range(40))
    last = done[-1]
    assert last.step_time == max(s.duration_s for s in last.summaries.values())
    assert last.median_time == statistics.median(s.duration_s for s in last.summaries.values())


def test_steps_complete_once_all_ranks_reported() -> None:
    messages = [m for m in synthetic_run() if not isinstance(m, Event)]
    state = ClusterState()
    completed = [a.step for m in messages[: 4 + 3] for a in state.ingest(m)]
    assert completed == []  # 3 of 4 ranks reported step 0
    assert [a.step for a in state.ingest(messages[7])] == [0]


def test_a_step_missing_a_report_closes_when_a_later_one_completes() -> None:
    messages = [m for m in synthetic_run() if not isinstance(m, Event)]
    dropped = next(m for m in messages if isinstance(m, StepReport) and m.step == 1 and m.rank == 2)
    state = ClusterState()
    closed = [a.step for m in messages if m is not dropped for a in state.ingest(m)]
    assert closed == list(range(40))
    assert sorted(state.steps[1].summaries) == [0, 1, 3]


def test_straggler_after_n_outlier_steps_only() -> None:
    # Rank 3 slows down from step 20; the alert needs three outlier steps in a row.
    assert "straggler" not in _kinds(_state(until_step=21))
    state = _state(until_step=22)
    alerts = {a.kind: a for a in state.alerts()}
    assert alerts["straggler"].ranks == (3,)
    assert state.slowness(3) == pytest.approx(1.35, abs=0.05)


def test_overflow_storm_comes_and_goes() -> None:
    assert "overflow_storm" in _kinds(_state(until_step=3))  # 4 skipped steps at start-up
    assert "overflow_storm" not in _kinds(_state())  # one overflow in the last ten


def test_silence_is_judged_against_the_callers_clock() -> None:
    state = _state()
    assert "silent" not in _kinds(state)
    later = state.clock_s + 2.5
    assert {a.kind: a.ranks for a in state.alerts(later)}["silent"] == (0, 1, 2, 3)
    for r in range(4):
        state.ingest(Bye(rank=r, step=40, wall_ns=BASE_NS), received_s=state.clock_s)
    assert "silent" not in _kinds(state, later)


def test_agent_drops_are_summed() -> None:
    alert = {a.kind: a for a in _state().alerts()}["drops"]
    assert alert.ranks == (1,) and "3 messages" in alert.message


def _report(rank: int, step: int, **kw: object) -> StepReport:
    fields = dict(rank=rank, step=step, wall_ns=BASE_NS + step * 10**9, duration_s=1.0)
    fields.update(kw)
    return StepReport(**fields)  # type: ignore[arg-type]


def test_exposed_comm_memory_headroom_and_minimum_loss_scale() -> None:
    state = ClusterState()
    heavy = [Collective("all_gather", 10**8, 2, 0.1, 0.5, 0.4)]
    tight = HostSample(gpu_mem_total_bytes=80 * 10**9, gpu_mem_used_bytes=75 * 10**9)
    state.ingest(_report(0, 0, collectives=heavy, host=tight, loss_scale=1.0))
    state.ingest(_report(1, 0, loss_scale=1.0))
    alerts = {a.kind: a for a in state.alerts()}
    # A cluster-wide condition (the least-exposed rank's wait), not a rank's fault.
    assert alerts["exposed_comm"].ranks == () and "40%" in alerts["exposed_comm"].message
    assert alerts["memory"].ranks == (0,)
    assert "loss_scale_min" in alerts
    summary = state.ranks[0].summary
    assert summary is not None
    assert summary.ops["all_gather"].busbw == pytest.approx(busbw("all_gather", 10**8, 0.5, 2))
    assert summary.ops["all_gather"].busbw == pytest.approx(10**8 / 0.5 / 2)


def test_the_step_line_says_the_gradient_norm_where_a_rank_reported_one() -> None:
    """The largest rank's norm (under data parallelism all are the one global norm); nan when a
    rank's was (an overflowed fp16 step); left out of the line when no rank's job clipped."""
    state = ClusterState()
    nan = float("nan")  # (step 0 makes both ranks known: a step closes on every known rank)
    norms = {0: (None, None), 1: (1.25, 1.5), 2: (nan, 2.0), 3: (None, None), 4: (None, None)}
    closed = state.ingest_all(
        [_report(r, step, grad_norm=pair[r]) for step, pair in norms.items() for r in (0, 1)]
    )
    by_step = {a.step: a for a in closed}
    assert by_step[1].grad_norm == 1.5
    assert "loss      NA  gnorm    1.5  scale" in step_line(by_step[1])
    assert by_step[2].grad_norm is not None and math.isnan(by_step[2].grad_norm)
    assert "gnorm    nan" in step_line(by_step[2])
    assert by_step[3].grad_norm is None and "gnorm" not in step_line(by_step[3])


def test_the_runs_summary_says_its_final_and_largest_finite_gradient_norm() -> None:
    """The final norm, and the largest finite one with its step (an overflowed step's inf or
    nan skipped its update: no spike); NA-free runs of jobs that never clip say nothing."""
    inf = float("inf")
    by_step = [(0.5, 0.5), (3.0, 3.0), (inf, inf), (float("nan"), 9.0), (1.0, 1.0)]
    state = ClusterState()
    state.ingest_all(
        [_report(r, step, grad_norm=pair[r]) for step, pair in enumerate(by_step) for r in (0, 1)]
    )
    state.flush()
    t = state.totals
    assert (t.grad_norm_final, t.grad_norm_max, t.grad_norm_max_step) == (1.0, 3.0, 1)
    assert any("grad norm 1 (largest 3 at step 1); " in line for line in summary_lines(state))
    report = run_report(state)
    assert (report["grad_norm_final"], report["grad_norm_max"]) == (1.0, 3.0)
    assert report["grad_norm_max_step"] == 1
    plain = ClusterState()
    plain.ingest_all([_report(r, step) for step in range(3) for r in (0, 1)])
    plain.flush()
    assert not any("grad norm" in line for line in summary_lines(plain))
    assert run_report(plain)["grad_norm_max"] is None


def test_missing_figures_stay_none_and_print_na() -> None:
    state = ClusterState()
    (agg,) = state.ingest(_report(0, 0, memory=MemoryBytes(params=10)))
    assert agg.loss is None and agg.loss_scale is None
    assert state.ranks[0].summary is not None and state.ranks[0].summary.offload_bw is None
    line = step_line(agg)
    assert "loss      NA" in line and "A NA" in line and "scale     NA" in line
    assert state.throughput() == (None, None)


def test_throughput_from_the_ranks_own_instants() -> None:
    state = _state()
    steps_s, samples_s = state.throughput(window=10)
    done = state.complete_steps()[-11:]
    span = (done[-1].wall_ns - done[0].wall_ns) / 1e9
    assert steps_s == pytest.approx(10 / span)
    assert samples_s == pytest.approx(10 * 4 * 4 / span)


def test_summary_lists_the_standing_alerts_and_the_trace() -> None:
    lines = summary_lines(_state(), trace="runs/x.zstrace")
    assert lines[0] == "job demo-0001: 40 steps on 4 ranks"
    assert "5 skipped" in lines[1]
    assert any(line.startswith("alert: straggler r3") for line in lines)
    assert lines[-1] == "trace: runs/x.zstrace"


def test_rules_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="storm_overflows"):
        AlertRules(storm_overflows=5, storm_window=3)


def test_a_collector_hearing_one_node_of_two_still_closes_steps() -> None:
    # world_size 4, but only ranks 0 and 1 report here (the other node has its own collector).
    messages = [
        m for m in synthetic_run() if getattr(m, "rank", 0) < 2 and not isinstance(m, Event)
    ]
    state = ClusterState()
    closed = [a.step for m in messages for a in state.ingest(m)]
    assert state.world_size == 4
    assert closed == list(range(38))  # a step closes two fully reported steps later
    assert [a.step for a in state.flush()] == [38, 39]
    assert all(sorted(a.summaries) == [0, 1] for a in state.complete_steps())


def test_a_collective_no_clock_measured_counts_bytes_only_and_its_figures_print_na() -> None:
    """A collective whose clock is ``none`` (seen, not timed: DDP's reducer on gloo read from
    the Flight Recorder) adds to count, bytes and volume; its duration, busbw and exposed time
    are NA, never 0 and never a host gap shown as a duration. A timed op beside it keeps its own
    busbw (the independent answer: nccl-tests' formula on that op alone); the step's and the
    run's busbw, over both, are NA: the timed part would pass for the whole."""
    from zeroscope.state.report import run_report

    untimed = Collective("all_reduce", 4000, 2, 0.1, 0.0, 0.0, False, "", "none", False)
    timed = Collective("all_gather", 10**6, 2, 0.2, 0.5, 0.1)
    state = ClusterState()
    for step in range(3):
        for rank in range(2):
            state.ingest(_report(rank, step, collectives=[untimed, untimed, timed]))
    state.flush()
    s = state.ranks[0].summary
    assert s is not None
    ar, ag = s.ops["all_reduce"], s.ops["all_gather"]
    assert (ar.count, ar.nbytes, ar.volume, ar.untimed) == (2, 8000, 16000, 2)
    assert ar.busbw is None and ar.time_s is None and ar.exposed is None
    assert ag.busbw == pytest.approx(busbw("all_gather", 10**6, 0.5, 2))
    assert ag.time_s == 0.5 and ag.exposed == 0.1
    assert s.comm_volume == 16000 + 10**6 and s.collectives == 3
    assert s.busbw is None and state.ranks[0].totals.busbw is None
    assert s.busy_s == pytest.approx(0.5)  # the untimed ops span nothing
    # Some waits unmeasured: the exposed share is NA for the rank, the step and the run.
    assert s.exposed is None and s.exposed_share is None
    assert state.steps[2].exposed_share is None
    assert state.totals.exposed_share is None and state.ranks[0].totals.exposed_share is None
    report = run_report(state)
    assert report["exposed_percent"] is None
    assert report["total"]["busbw_bytes_s"] is None and report["ranks"][0]["busbw_bytes_s"] is None
    # Steady steps 1-2 of two ranks: 4 x 3 collectives, 4 x 2 of them untimed.
    assert (report["collectives"], report["untimed_collectives"]) == (12, 8)
    assert "exposed comm NA" in "\n".join(summary_lines(state))


def test_an_op_partly_timed_shows_no_busbw_nor_time() -> None:
    """DDP's bucket all-reduces (no clock on gloo) beside a 4-byte all-reduce the host timed
    (a logged loss's mean, as the HF Trainer makes it): the op's busbw over the timed one alone
    read 0.000 GB/s in ``zeroscope summary``; its busbw and time are NA, its count and bytes
    exact, and the summary says why busbw is NA."""
    from zeroscope.commands.summary import format_table
    from zeroscope.state.report import run_report

    bucket = Collective("all_reduce", 264_196, 2, 0.1, 0.0, 0.0, False, "", "none", False)
    loss = Collective("all_reduce", 4, 2, 0.2, 0.004, 0.004)
    state = ClusterState()
    for step in range(3):
        for rank in range(2):
            state.ingest(_report(rank, step, collectives=[bucket, loss]))
    state.flush()
    s = state.ranks[1].summary
    assert s is not None
    ar = s.ops["all_reduce"]
    assert (ar.count, ar.nbytes, ar.untimed) == (2, 264_200, 1)
    assert ar.busbw is None and ar.time_s is None and s.busbw is None
    assert busbw("all_reduce", 4, 0.004, 2) < 1e4  # what the timed part alone would show
    report = run_report(state)
    assert report["total"]["busbw_bytes_s"] is None
    table = format_table({**report, "trace": "t", "step_range": [0, 2], "events": 0})
    assert "busbw NA: 4 of 8 collectives" in table


def test_old_traces_decode_as_host_timed() -> None:
    """The clock fields come last with defaults: a collective encoded before they existed
    (eight fields) decodes as what it was, measured on the host."""
    import msgspec

    old = msgspec.msgpack.encode(["all_reduce", 64, 2, 0.0, 0.5, 0.25, False, "x"])
    c = msgspec.msgpack.decode(old, type=Collective)
    assert (c.clock, c.exposed_measured, c.duration_s, c.label) == ("host", True, 0.5, "x")


def test_unaligned_ranks_time_per_step_agrees_with_steps_per_s() -> None:
    """DDP-shaped ranks whose step ends are not aligned: rank 0 alternates 30/40 ms steps, rank 1
    40/30 ms, each rank's own steps tiling its clock. Each rank's mean is 35 ms and so is the
    period of the step ends; the slowest rank of every step is 40 ms, which the summary used to
    print beside 1/35 ms steps/s."""
    state = ClusterState()
    ends = {0: BASE_NS, 1: BASE_NS}
    for step in range(1, 42):
        for rank in (0, 1):
            dur = 0.030 if (step + rank) % 2 else 0.040
            ends[rank] += int(dur * 1e9)
            state.ingest(StepReport(rank=rank, step=step, wall_ns=ends[rank], duration_s=dur))
    state.flush()
    t = state.totals
    assert t.steps_per_s is not None and t.mean_step_s is not None
    assert t.mean_step_s == pytest.approx(1 / t.steps_per_s)
    assert t.mean_step_s == pytest.approx(0.035, rel=0.02)
    for rank in (0, 1):
        assert state.ranks[rank].totals.mean_step_s == pytest.approx(0.035, rel=0.02)


def test_scale_events_are_newest_step_first_whatever_their_arrival() -> None:
    """Ranks' events arrive interleaved (rank 1's step-3 overflow after rank 0's step-5 scale
    change): the loss-scale list, titled newest first, is in step order, ranks in order."""
    state = ClusterState()
    arrivals = [
        (0, 2, "overflow"),
        (0, 5, "scale_change"),
        (1, 3, "overflow"),
        (1, 5, "overflow"),
        (0, 4, "checkpoint"),
        (0, 3, "overflow"),
    ]
    for rank, step, kind in arrivals:
        state.ingest(Event(rank=rank, step=step, wall_ns=0, event=kind))  # type: ignore[arg-type]
    got = [(e.step, e.rank, e.event) for e in state.scale_events()]
    assert got == [
        (5, 0, "scale_change"),
        (5, 1, "overflow"),
        (3, 0, "overflow"),
        (3, 1, "overflow"),
        (2, 0, "overflow"),
    ]
    assert len(state.scale_events(limit=2)) == 2


def test_a_job_that_never_communicates_has_no_exposed_share() -> None:
    """Ranks with no collective at all (accelerate on CPU built no process group: two
    independent processes) have NA exposed comm each; the run's was 0 %, a figure of nothing.
    One step with a collective makes the share real again, with 0 on the quiet steps."""
    state = ClusterState()
    for step in range(3):
        for rank in range(2):
            state.ingest(_report(rank, step))
    state.flush()
    assert state.ranks[0].totals.exposed_share is None and state.steps[2].exposed_share is None
    assert state.totals.exposed_share is None
    assert "exposed comm NA" in "\n".join(summary_lines(state))
    timed = Collective("all_reduce", 10**6, 2, 0.2, 0.5, 0.1)
    mixed = ClusterState()
    for step in range(4):
        for rank in range(2):
            mixed.ingest(_report(rank, step, collectives=[timed] if step == 3 else []))
    mixed.flush()
    assert mixed.totals.exposed_share == pytest.approx(0.1 / mixed.totals.step_time_s)


def test_pipeline_stages_are_not_compared_with_each_other() -> None:
    """A 2-stage pipeline x 2 replicas: stage 0 sends activations, stage 1 receives them, by
    design (the bundled pipeline demo's advise read 'rank 1's collectives diverge ... ERROR').
    Only a stage's replicas must match: rank 3 off its stage-1 peer rank 1 is the divergence."""
    from zeroscope.agent.schema import SCHEMA_VERSION, Hello, ParallelLayout

    send = Collective("send", 4096, 2, 0.0, 0.001, 0.001, label="fwd_send")
    recv = Collective("recv", 4096, 2, 0.0, 0.001, 0.001, label="fwd_recv")
    other = Collective("recv", 8192, 2, 0.0, 0.001, 0.001, label="fwd_recv")
    state = ClusterState()
    for rank in range(4):
        layout = ParallelLayout(dp=rank // 2, pp=rank % 2, dp_size=2, pp_size=2)
        state.ingest(
            Hello(
                schema_version=SCHEMA_VERSION, job_id="j", rank=rank, world_size=4, parallel=layout
            )
        )
    for step in (1, 2):
        for rank in range(4):
            ops = [send] if rank % 2 == 0 else [other if (rank, step) == (3, 2) else recv]
            state.ingest(_report(rank, step, collectives=ops))
    state.flush()
    book = state.sequences
    assert [(d.step, d.ranks, d.reference) for d in book.divergences] == [(2, (3,), (1,))]
    assert book.count == 1


def test_a_pipeline_stage_is_a_straggler_only_against_its_own_replicas() -> None:
    """Stages compute different layers: stage 1 taking 1.7x stage 0 is the pipeline's balance
    (its screen weighs it), not a straggler (the bundled pipeline demo's alert strip named
    one). Within a stage a slow replica still is: rank 3 against its stage-1 peer rank 1."""
    from zeroscope.agent.schema import SCHEMA_VERSION, Hello, ParallelLayout

    def run(slow: int | None) -> list[tuple[str, int]]:
        state = ClusterState()
        for rank in range(4):
            layout = ParallelLayout(dp=rank // 2, pp=rank % 2, dp_size=2, pp_size=2)
            state.ingest(
                Hello(
                    schema_version=SCHEMA_VERSION, job_id="j", rank=rank, world_size=4,
                    parallel=layout,
                )
            )  # fmt: skip
        for step in range(1, 13):
            for rank in range(4):
                seconds = 0.1 * (1.7 if rank % 2 else 1.0) * (1.5 if rank == slow else 1.0)
                state.ingest(_report(rank, step, duration_s=seconds))
        state.flush()
        return [(f.kind, f.rank) for f in state.lags.findings()]

    assert run(None) == []
    assert run(3) == [("straggler", 3)]


def test_ddps_predicted_traffic_counts_only_the_trainable_gradients() -> None:
    """DDP all-reduces the gradients of the parameters that have one: a LoRA'd model's frozen
    base moves nothing (a new user's LoRA run over DDP read 28.8KB against a predicted 883KB,
    the whole model's all-reduce)."""
    from zeroscope.agent.schema import SCHEMA_VERSION, ConfigSummary, Hello, ParamCounts
    from zeroscope.state.prediction import predicted_traffic

    state = ClusterState()
    state.ingest(
        Hello(
            schema_version=SCHEMA_VERSION, job_id="j", rank=0, world_size=2,
            config=ConfigSummary(stage=0, precision="fp32", dp_world_size=2),
            params=ParamCounts(total=110_400, trainable=3_584),
        )
    )  # fmt: skip
    prediction = predicted_traffic(state)
    assert prediction is not None and prediction.volume == 2 * 3_584 * 4


def test_unmeasured_waits_judge_no_straggler() -> None:
    """DDP on gloo: the bucket all-reduces' waits are unmeasured, and under synchronous
    collectives every rank's step time is the same, whoever computed longer. The step less an
    unmeasured wait was taken for compute: slowness read ~1.0x for both ranks and the step line
    named whichever rank's step was a hair longer (here r0, though r1 is the one that computed
    150 ms more). Compute, slowness and the slowest rank are NA; with the waits measured the
    same steps name r1."""

    def ddp_step(rank: int, step: int, measured: bool) -> StepReport:
        wait = 0.16 if rank == 0 else 0.01  # r0 waits for r1 inside the all-reduce
        bucket = Collective(
            "all_reduce",
            4096,
            2,
            0.0,
            wait,
            wait,
            False,
            "",
            "host" if measured else "none",
            measured,
        )
        return _report(rank, step, duration_s=0.2751 if rank == 0 else 0.2750, collectives=[bucket])

    for measured in (False, True):
        state = ClusterState()
        lines = []
        for step in range(6):
            for rank in (0, 1):
                for agg in state.ingest(ddp_step(rank, step, measured)):
                    if len(agg.summaries) == 2:
                        lines.append(step_line(agg))
        state.flush()
        s0 = state.ranks[0].summary
        assert s0 is not None
        if measured:
            assert s0.compute_s == pytest.approx(0.2751 - 0.16)
            assert state.ranks[1].slowness is not None and state.ranks[1].slowness > 1.5
            assert lines and all("slowest r1 (+150ms compute)" in ln for ln in lines)
        else:
            assert s0.compute_s is None
            assert state.ranks[0].slowness is None and state.ranks[1].slowness is None
            assert lines and all("slowest NA" in ln for ln in lines)
            assert "straggler" not in {a.kind for a in state.alerts()}
