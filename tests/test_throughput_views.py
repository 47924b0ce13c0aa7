"""Tokens/s, model FLOP/s and MFU where users look in the TUI: the rank table's column, the
rank detail's group and the history plots, against the figures recomputed by hand from the
reports (tokens / step time, FLOPs / step time / peak). The fixture run (tests/fixtures.py)
with a known ``work`` added to every step report; without it the screens stay as they were
(the snapshots in tests/test_tui_snapshots.py hold that)."""

from __future__ import annotations

import msgspec
import pytest

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import screen_text, sync
from zeroscope.agent.schema import StepReport, Work
from zeroscope.state import ClusterState, units
from zeroscope.state.viewmodel import rank_rows
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.plots import cluster_charts, rank_charts
from zeroscope.tui.rank_figures import rank_figures
from zeroscope.tui.rank_table import RankTable

TOKENS, FLOPS, PEAK = 4096, 3e12, 1e14
SOURCE = "datasheet H100 bf16 dense"


def _work() -> Work:
    return Work(
        tokens=TOKENS,
        positions=TOKENS,
        seq_len=512,
        flops=FLOPS,
        peak_flops=PEAK,
        peak_source=SOURCE,
        dense_params=1000,
        layers=2,
        hidden=16,
    )


def _state(work: bool = True, ranks: int = 4) -> tuple[ClusterState, list[StepReport]]:
    messages = list(synthetic_run(RunShape(ranks=ranks, steps=40)))
    if work:
        messages = [
            msgspec.structs.replace(m, work=_work()) if isinstance(m, StepReport) else m
            for m in messages
        ]
    state = ClusterState()
    state.ingest_all(messages)
    return state, [m for m in messages if isinstance(m, StepReport)]


def _latest(reports: list[StepReport], rank: int) -> StepReport:
    return max((r for r in reports if r.rank == rank), key=lambda r: r.step)


def test_rank_rows_carry_each_ranks_figures_by_hand() -> None:
    state, reports = _state()
    for row in rank_rows(state):
        mine = _latest(reports, row.rank)
        t = row.throughput
        assert t is not None
        assert t.tokens_per_s == pytest.approx(TOKENS / mine.duration_s)
        assert t.mfu == pytest.approx(FLOPS / mine.duration_s / PEAK)
    bare, _ = _state(work=False)
    assert all(row.throughput is None for row in rank_rows(bare))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
@sync
async def test_the_rank_table_shows_mfu_and_tokens_when_wide(size: tuple[int, int]) -> None:
    state, reports = _state()
    app = ZeroscopeApp(state)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        table = app.screen.query_one(RankTable)
        lines = table.render().plain.splitlines()
        assert "MFU" in lines[0] and ("tok/s" in lines[0]) == (size[0] >= 100)
        assert all(len(line) <= table.size.width for line in lines)
        for line in lines[1:]:
            rank = int(line.split()[0].removeprefix("r"))
            mine = _latest(reports, rank)
            assert units.fine_percent(FLOPS / mine.duration_s / PEAK) in line
            if size[0] >= 100:
                assert units.count(TOKENS / mine.duration_s) in line
        text = screen_text(app)
        assert "MFU" in text


@sync
async def test_a_job_without_work_keeps_the_table_as_it_was() -> None:
    state, _ = _state(work=False)
    app = ZeroscopeApp(state)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        header = app.screen.query_one(RankTable).render().plain.splitlines()[0]
        assert "MFU" not in header and "tok/s" not in header


def test_the_rank_detail_shows_the_throughput_group() -> None:
    """The rank detail's every-figure pane (below the plots: read as the pane draws it)."""
    state, reports = _state()
    text = rank_figures(state.ranks[3], 160).plain
    mine = _latest(reports, 3)
    assert "model throughput" in text and f"peak: {SOURCE}" in text
    assert units.fine_percent(FLOPS / mine.duration_s / PEAK) in text
    assert units.count(TOKENS / mine.duration_s) in text
    assert "model throughput" not in rank_figures(_state(work=False)[0].ranks[3], 160).plain


def test_the_history_plots_chart_mfu_and_tokens_per_step() -> None:
    state, reports = _state()
    charts = cluster_charts(state.series, state.rules.exposed_max)
    points = list(state.series.points)
    # The cluster's MFU: every rank's FLOPs over (the step's time x the sum of the peaks).
    by_step: dict[int, list[StepReport]] = {}
    for r in reports:
        by_step.setdefault(r.step, []).append(r)
    want = [len(by_step[p.step]) * FLOPS / (p.step_time * PEAK * 4) * 100 for p in points]
    assert charts["mfu"].has_data()
    assert charts["mfu"].lines[0].ys == pytest.approx(want)
    tokens = [len(by_step[p.step]) * TOKENS / p.step_time for p in points]
    assert charts["tokens"].lines[0].ys == pytest.approx(tokens)
    mine = rank_charts(state, 3, state.series)
    hist = list(state.ranks[3].history)
    assert mine["mfu"].lines[0].ys == pytest.approx(
        [FLOPS / s.duration_s / PEAK * 100 for s in hist]
    )
    bare, _ = _state(work=False)
    charts = cluster_charts(bare.series, bare.rules.exposed_max)
    assert not charts["mfu"].has_data() and not charts["tokens"].has_data()


def test_mfu_fits_its_seven_columns_at_every_magnitude() -> None:
    """A CPU job's MFU is ~1e-5: ``.2g`` gave "0.00078%", 8 characters in the rank table's
    7-column field, and it ran into the loss scale beside it ("81920.00078%"). Each value fits,
    with its digits, and the rank table's cell is preceded by a space."""
    for fraction, shown in (
        (0.4123, "41.2%"),
        (0.0123, "1.2%"),
        (0.00123, "0.12%"),
        (0.000123, "0.012%"),
        (7.8e-6, "<0.01%"),
        (1e-12, "<0.01%"),
        (0.0, "0%"),
    ):
        assert units.fine_percent(fraction) == shown and len(shown) <= 7
