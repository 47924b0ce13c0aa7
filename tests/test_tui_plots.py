"""History plots: the cluster screen's charts in the space the ranks leave, a rank's
beside the cluster's, replay's whole-run series with a cursor at the replayed step. Pilot tests
at 80x24 and 160x48 on the deterministic fixture run (tests/fixtures.py: the last rank computes
45 % longer from step 20 on; every rank's step time is the same under synchronous collectives).
"""

from __future__ import annotations

import pytest

from tests.fixtures import MemoryTrace, RunShape, synthetic_run
from tests.test_tui import fixture_state, screen_text, sync
from zeroscope.state import ClusterState
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.feed import ReplayFeed
from zeroscope.tui.history_plot import HistoryPlot, nice_ticks, tick_labels
from zeroscope.tui.history_plots import HistoryPlots
from zeroscope.tui.plots import cluster_charts, rank_charts
from zeroscope.tui.rank_screen import RankScreen

ALL = ["step", "loss", "memory", "exposed", "offload"]


@pytest.mark.parametrize(
    ("ranks", "size", "first_page"),
    [
        (2, (160, 48), ALL),  # a table of 3 rows: every chart at once
        (64, (160, 48), ALL),  # 64 rows do not fit beside the plots: the heatmap takes 3
        (2, (80, 24), ["step", "loss", "memory", "exposed"]),
        (64, (80, 24), ["step", "loss"]),
    ],
)
@sync
async def test_the_plots_take_the_space_the_ranks_leave(
    ranks: int, size: tuple[int, int], first_page: list[str]
) -> None:
    app = ZeroscopeApp(fixture_state(ranks=ranks))
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        plots = app.screen.query_one(HistoryPlots)
        assert plots.shown == first_page
        text = screen_text(app)
        assert "step [ms]" in text and "loss" in text
        assert app.screen.has_class("heatmap") == (ranks == 64)
        if plots.more:
            # What does not fit is a key away, named on screen.
            assert "n: more plots" in text
            await pilot.press("n")
            await pilot.pause()
            assert plots.shown and plots.shown[0] == ALL[len(first_page)]
            assert "exposed comm" in screen_text(app) or "offload" in screen_text(app)


def test_the_charts_are_the_state_series_with_the_straggler_steps_marked() -> None:
    state = fixture_state(ranks=4, steps=40)
    charts = cluster_charts(state.series, state.rules.exposed_max)
    step = charts["step"]
    slowest, median, marks = step.lines
    assert median.ys == pytest.approx([p.median_time * 1e3 for p in state.series.points])
    # Plotted in ms: the state's step times, point for point.
    assert slowest.ys == pytest.approx([p.step_time * 1e3 for p in state.series.points])
    # The fixture's r3 straggles from step 20: exactly those steps carry the mark.
    assert marks.xs == list(range(20, 40)) and marks.label == "straggler r3"
    mem = charts["memory"]
    assert [line.label for line in mem.lines] == ["A", "O", "G", "P", "host"]
    top = mem.lines[0].ys[-1]  # the stack's top: P+G+O+A of the largest rank, in MB
    p = state.series.points[-1]
    assert top == pytest.approx((p.params + p.grads + p.optim + p.activations) / 1e6)  # type: ignore[operator]
    assert charts["exposed"].hline == pytest.approx(30.0)


@sync
async def test_rank_detail_plots_the_rank_beside_the_cluster_median() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(160, 48)) as pilot:
        app.open_rank(3)
        await pilot.pause()
        assert isinstance(app.screen, RankScreen)
        text = screen_text(app)
        assert "rank 3 beside the cluster over steps" in text
        assert "─r3 ─median" in text and "─r3 ─rank mean" in text
        charts = rank_charts(app.state, 3, app.state.series)
        mine, theirs = charts["exposed"].lines
        # r3 is the straggler: from step 20 the others wait for it, so the median rank's
        # exposed share rises far above r3's own.
        late = [(a, b) for x, a, b in zip(mine.xs, mine.ys, theirs.ys) if x >= 25]
        assert late and all(b > 3 * a for a, b in late)  # type: ignore[operator]


@sync
async def test_a_frame_that_moves_no_series_builds_no_chart() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        plots = list(app.screen.query(HistoryPlot))
        built = sum(p.builds for p in plots)
        assert built >= 5
        app.state.version += 1  # e.g. a heartbeat: the table redraws, the series did not move
        app.redraw()
        await pilot.pause()
        assert sum(p.builds for p in plots) == built


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
@sync
async def test_replay_plots_the_whole_run_with_a_cursor_at_the_replayed_step(
    size: tuple[int, int],
) -> None:
    feed = ReplayFeed(MemoryTrace(synthetic_run(RunShape(ranks=2))), start_step=10, paused=True)
    app = ZeroscopeApp(ClusterState(), feed, refresh_s=0.05)
    async with app.run_test(size=size) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.run_series is not None and app.cursor == 10:
                break
        assert app.run_series is not None and len(app.run_series.points) == 40
        await pilot.pause(0.2)
        text = screen_text(app)
        assert "│ step 10" in text  # the cursor's legend
        assert " 30 " in text  # the x axis runs past the cursor to the run's end
        await pilot.press("right")
        for _ in range(40):
            await pilot.pause(0.05)
            if app.cursor == 11:
                break
        await pilot.pause(0.3)
        assert "│ step 11" in screen_text(app)


def test_nice_ticks() -> None:
    assert nice_ticks(0, 220, 2) == [0, 200]
    assert nice_ticks(0, 220, 3) == [0, 100, 200]
    assert nice_ticks(1.35, 4.3, 3) == [2, 3, 4]
    assert nice_ticks(0, 39, 8) == [0, 5, 10, 15, 20, 25, 30, 35]


def test_tick_labels_never_read_alike() -> None:
    """A replay's loss chart labelled two ticks "5.55" (a new user's run: its loss moved by
    0.004); such ticks get the digits that tell them apart, other charts keep their format."""
    ticks = nice_ticks(5.548, 5.556, 3)
    three = [f"{v:.3g}" for v in ticks]
    assert len(set(three)) < len(three)  # the case: three digits read alike
    labels = tick_labels(ticks, lambda v: f"{v:.3g}")
    assert len(set(labels)) == len(labels) and [float(x) for x in labels] == ticks
    assert tick_labels([0, 100, 200], lambda v: f"{v:.3g}") == ["0", "100", "200"]


def test_replay_overview_reads_the_trace_in_slices() -> None:
    feed = ReplayFeed(MemoryTrace(synthetic_run(RunShape(ranks=4))), paused=True)
    feed.poll(0)  # the initial seek comes first
    seen = None
    for _ in range(1000):
        batch = feed.poll(0)
        if batch is not None and batch.overview is not None:
            seen = batch.overview
            break
    assert seen is not None and [p.step for p in seen.points] == list(range(40))
    assert not feed.reading_overview
