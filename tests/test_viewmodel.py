"""The view-models (zeroscope.state.viewmodel): each screen's values come with their judgement,
against hand-computed answers at the rules' boundaries (the screens only map a level to a
colour; tests/test_judgements.py checks that they compare nothing themselves)."""

from __future__ import annotations

import math

from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Collective,
    ConfigSummary,
    Event,
    Hello,
    MemoryBytes,
    Message,
    ParamCounts,
    StepReport,
)
from zeroscope.state import ClusterState
from zeroscope.state.viewmodel import (
    comm_view,
    heat_view,
    loss_scale_view,
    memory_view,
    price_words,
    rank_comm_view,
    rank_rows,
)

NS = 10**9
BF16_STAGE0 = ConfigSummary(stage=0, precision="bf16", dp_world_size=2)  # type: ignore[call-arg]


def _state(messages: list[Message]) -> ClusterState:
    state = ClusterState()
    for m in messages:
        state.ingest(m)
    state.flush()
    return state


def _hellos(config: ConfigSummary | None, ranks: int = 2) -> list[Message]:
    return [
        Hello(
            schema_version=SCHEMA_VERSION,
            job_id="vm",
            rank=r,
            world_size=ranks,
            config=config,
            params=ParamCounts(total=1000, trainable=1000, padded_total=1000) if config else None,
        )
        for r in range(ranks)
    ]


def test_memory_view_judges_each_part_against_the_formula() -> None:
    # Ψ = 1000, bf16 mixed precision, stage 0 (nothing sharded): P = 2Ψ, G = 2Ψ, O = 12Ψ
    # (fp32 master weights, momentum and variance), nothing on the host.
    memory = MemoryBytes(params=2000, grads=2000 * 111 // 100, optim=12000 * 109 // 100)
    state = _state(
        [
            *_hellos(BF16_STAGE0),
            StepReport(rank=0, step=1, wall_ns=NS, duration_s=0.1, memory=memory),
            StepReport(
                rank=1,
                step=1,
                wall_ns=NS,
                duration_s=0.1,
                memory=MemoryBytes(params=2000, grads=2000, optim=12000, host_optim=5),
            ),
        ]
    )
    view = memory_view(state)
    assert view.predicted is not None
    r0, r1 = view.rows
    p, g, o, host = r0.parts
    assert (p.predicted, g.predicted, o.predicted, host.predicted) == (2000, 2000, 12000, 0)
    # 11 % over is past the 10 % tolerance; 9 % over is within it.
    assert (p.level, g.level, o.level) == ("ok", "bad", "ok")
    assert math.isclose(g.deviation or 0, 0.11) and math.isclose(o.deviation or 0, 0.09)
    # Nothing predicted on the host: holding none is ok, holding some is news, and bad.
    assert (host.word, host.level) == ("ok", "ok")
    assert (r1.parts[3].word, r1.parts[3].level, r1.parts[3].deviation) == ("new", "bad", None)


def test_memory_view_without_a_config_is_na() -> None:
    state = _state([*_hellos(None), StepReport(rank=0, step=1, wall_ns=NS, duration_s=0.1)])
    view = memory_view(state)
    assert view.predicted is None and "NA" in view.basis
    assert {cell.level for row in view.rows for cell in row.parts} == {"na"}


def _comm_step(rank: int, step: int, volume_bytes: int, exposed: float) -> StepReport:
    """One all-reduce of ``volume_bytes / 2`` bytes (an all-reduce's volume counts it twice),
    ``exposed`` of its 0.1 s exposed in a 1 s step."""
    return StepReport(
        rank=rank,
        step=step,
        wall_ns=step * NS,
        duration_s=1.0,
        collectives=[Collective("all_reduce", volume_bytes // 2, 2, 0.5, 0.1, exposed)],
    )


def test_comm_view_judges_the_traffic_ratio_and_the_exposed_share() -> None:
    # Stage 0, Ψ = 1000 bf16: one gradient all-reduce of 2Ψ elements x 2 bytes = 4000 bytes.
    for volume, level in ((4400, "ok"), (4440, "warn"), (3600, "ok"), (3560, "warn")):
        state = _state([*_hellos(BF16_STAGE0), *(_comm_step(r, 1, volume, 0.0) for r in (0, 1))])
        view = comm_view(state, ["all_reduce", "all_gather"])
        assert view.predicted is not None and view.predicted.volume == 4000
        assert math.isclose(view.ratio or 0, volume / 4000)
        assert view.ratio_level == level, (volume, view.ratio)
        assert list(view.busbw) == ["all_reduce"]  # no all-gather was measured: not listed
    # Exposed 0.31 s of a 1 s step on both ranks is past the 30 % alert; 0.30 s is not.
    for exposed, level in ((0.31, "bad"), (0.30, "ok")):
        state = _state([*_hellos(None), *(_comm_step(r, 1, 4000, exposed) for r in (0, 1))])
        view = comm_view(state, [])
        assert view.exposed_last is not None and math.isclose(view.exposed_last, exposed)
        assert (view.exposed_level, view.exposed_limit) == (level, 0.30)
        rank = rank_comm_view(state, 0)
        assert rank is not None and rank.exposed_level == level
        assert [op for op, _ in rank.ops] == ["all_reduce"]
    assert comm_view(_state(_hellos(None)), []).exposed_level == "na"


def test_rank_rows_and_heat_view_judge_slowness_on_one_scale() -> None:
    # Compute 1.0 s on rank 0, 1.1 s and 1.3 s on the others: slowness is each rank's step
    # time over the other ranks' median, so 1.3 / 1.05 = 1.24x (bad), 1.1 / 1.15 = 0.96 (ok).
    durations = {0: 1.0, 1: 1.1, 2: 1.3}
    state = _state(
        [
            *_hellos(None, ranks=3),
            *(
                StepReport(rank=r, step=s, wall_ns=s * NS, duration_s=d)
                for s in (1, 2, 3)
                for r, d in durations.items()
            ),
        ]
    )
    rows = sorted(rank_rows(state), key=lambda row: row.rank)
    assert [row.slowness_level for row in rows] == [
        state.rules.slowness_level(row.slowness) for row in rows
    ]
    assert rows[2].slowness is not None and rows[2].slowness > 1.2
    assert rows[2].slowness_level == "bad" and rows[0].slowness_level == "ok"
    heat = heat_view(state.rules, "step", rows)
    # Step time as a share of the largest (1.3 s): 0.77 and 0.85 are bands 1 and 1 (cuts
    # 0.7 / 0.85 / 0.95; 0.846 is at or below 0.85), the largest itself band 3.
    assert heat.values == [1.0, 1.1, 1.3] and heat.bands == [1, 1, 3]
    assert heat_view(state.rules, "slowness", rows).bands[2] == 2  # 1.24x: above 1.2, not 1.3


def test_loss_scale_view_axis_skips_and_event_levels() -> None:
    scales = [65536.0, 32768.0, 0.0]
    state = _state(
        [
            *_hellos(None, ranks=1),
            *(
                StepReport(
                    rank=0,
                    step=s,
                    wall_ns=s * NS,
                    duration_s=0.1,
                    loss_scale=scale,
                    overflow=s == 2,
                    skipped=s == 2,
                )
                for s, scale in enumerate(scales, 1)
            ),
            Event(rank=0, step=2, wall_ns=2 * NS, event="overflow"),
            Event(rank=0, step=3, wall_ns=3 * NS, event="nan_loss"),
        ]
    )
    view = loss_scale_view(state)
    assert view.log2_scales == [16.0, 15.0, None]  # a scale of 0 has no place on a log axis
    assert view.skipped == 1
    assert {e.event: level for e, level in view.events} == {"overflow": "warn", "nan_loss": "bad"}


def test_the_summary_table_shows_host_memory_when_something_was_offloaded() -> None:
    from zeroscope.agent.schema import MemoryBytes
    from zeroscope.commands.summary import format_table
    from zeroscope.state.viewmodel import run_report

    def step(rank: int, s: int, host_optim: int) -> StepReport:
        memory = MemoryBytes(
            params=2000,
            grads=0,
            optim=0,
            host_grads=4000 if host_optim else 0,
            host_optim=host_optim,
        )
        return StepReport(rank=rank, step=s, wall_ns=s * NS, duration_s=1.0, memory=memory)

    def table(host_optim: int) -> list[str]:
        state = _state(
            [*_hellos(None), *(step(r, s, host_optim * (r + 1)) for s in (1, 2) for r in (0, 1))]
        )
        report = run_report(state)
        return format_table(
            {**report, "trace": "t", "step_range": "1-2", "events": 0, "missing_ranks": []}
        ).splitlines()

    import re

    def header_on(lines: list[str]) -> list[str]:
        return lines[next(i for i, line in enumerate(lines) if line.startswith("rank ")) :]

    lines = header_on(table(6000))
    cells = [re.split(r"\s{2,}", line.strip()) for line in lines]
    col = cells[0].index("host peak")
    rows = {row[0]: row for row in cells[1:] if len(row) == len(cells[0])}
    # Offloaded G + O of each rank (4 kB + 6 kB, 4 kB + 12 kB); the cluster's, the larger.
    assert [rows[r][col] for r in ("0", "1", "all")] == ["10.0KB", "16.0KB", "16.0KB"]
    assert "host peak" not in header_on(table(0))[0]  # nothing offloaded: no host column


def test_price_words_sign_is_saves_or_costs() -> None:
    # The advice's saving is in milliseconds and bytes; a negative one is a cost.
    assert price_words(12.0, None) == ["saves 12.0 ms/step"]
    assert price_words(-4.0, 2_000_000_000) == ["costs 4.00 ms/step", "saves 2.0GB/rank"]
    assert price_words(0.0, -3e9) == ["saves 0.00 ms/step", "costs 3.0GB/rank"]
    assert price_words(None, None) == []


def test_the_run_report_carries_the_exposed_level_summary_marks() -> None:
    from zeroscope.commands.summary import format_table
    from zeroscope.state.viewmodel import run_report

    # Rank 0 waits 0.31 s of each 1 s step (past the 30 % alert), rank 1 0.10 s. Steady
    # steps only: the first step is left out of run figures, so three steps are reported.
    state = _state(
        [
            *_hellos(None),
            *(_comm_step(r, s, 4000, 0.31 if r == 0 else 0.10) for s in (1, 2, 3) for r in (0, 1)),
        ]
    )
    report = run_report(state)
    r0, r1 = report["ranks"]
    assert (r0["exposed_level"], r1["exposed_level"]) == ("bad", "ok")
    # The cluster's share is the least-exposed rank's: 10 %, ok.
    assert report["exposed_level"] == report["total"]["exposed_level"] == "ok"
    table = format_table(
        {**report, "trace": "t", "step_range": "1-3", "events": 0, "missing_ranks": []}
    )
    assert "31.0!" in table and "10.0!" not in table


def test_the_busbw_pane_says_why_it_is_empty() -> None:
    """DDP on gloo: its bucket all-reduces are reported (bytes, counts) with no clock, so no op
    has a busbw; the pane said "no collectives reported" beside a volume pane showing them."""
    untimed = Collective("all_reduce", 50_700, 2, 0.0, 0.0, 0.0, False, "", "none", False)

    def state_of(collectives: list[Collective]) -> ClusterState:
        state = ClusterState()
        for step in range(3):
            for rank in (0, 1):
                state.ingest(
                    StepReport(
                        rank=rank,
                        step=step,
                        wall_ns=10**18 + step * 10**9,
                        duration_s=0.1,
                        collectives=collectives,
                    )
                )
        state.flush()
        return state

    seen = comm_view(state_of([untimed]), ["all_reduce"])
    assert seen.busbw == {} and seen.busbw_none.startswith("busbw NA: no clock timed")
    assert comm_view(state_of([]), ["all_reduce"]).busbw_none == "no collectives reported"
