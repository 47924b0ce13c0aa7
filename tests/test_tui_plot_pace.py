"""What keeps the history plots within the 1024-rank frame's 50 ms (bench/tui_frame.py):
a series with more points than the chart has pixel columns is thinned before plotext draws it,
and while a job is live new data reaches the charts one per frame. Oracles: each column's
extremes found by brute force in the raw series; the points plotext is actually handed; the
compositor's own frames (each chart build is logged with the frame that drew it).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from textual.screen import Screen
from textual_plotext.plot import Plot

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import fixture_state, sync
from zeroscope.agent import schema
from zeroscope.state import ClusterState
from zeroscope.tui import history_plot
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.history_plot import HistoryPlot, _runs, build, thin, thin_marks
from zeroscope.tui.history_plots import HistoryPlots
from zeroscope.tui.plots import cluster_charts


def test_thin_keeps_each_columns_lowest_and_highest_point_and_no_more() -> None:
    rng = random.Random(7)
    xs = list(range(1000, 1512))
    ys = [1.4 + rng.uniform(-0.03, 0.03) for _ in xs]  # a loss on its noisy plateau
    x_lo, x_hi, columns = 1000, 1511, 104

    def column(x: int) -> int:
        return (x - x_lo) * columns // (x_hi - x_lo + 1)

    (kept_x, kept_y), *rest = thin(_runs(xs, ys), x_lo, x_hi, columns)
    assert not rest
    assert len(kept_x) <= 2 * columns < len(xs)
    assert set(zip(kept_x, kept_y)) <= set(zip(xs, ys))  # real points, none made up
    for c in range(columns):
        raw = [y for x, y in zip(xs, ys) if column(x) == c]
        kept = [y for x, y in zip(kept_x, kept_y) if column(x) == c]
        assert (min(kept), max(kept)) == (min(raw), max(raw))


def test_thin_keeps_gaps_wider_than_a_column_and_short_series_as_they_are() -> None:
    xs = list(range(600))
    ys: list[float | None] = [None if 200 <= x < 300 else float(x % 7) for x in xs]
    # 12 steps a column: the 100 missing steps span 8 columns and stay a gap.
    before, after = thin(_runs(xs, ys), 0, 599, 50)
    assert max(before[0]) // 12 == 199 // 12 and min(after[0]) // 12 == 300 // 12
    short = _runs(list(range(100)), [float(i) for i in range(100)])
    assert thin(short, 0, 99, 50) == short  # 100 points <= 2 a column: drawn as given


def test_thin_marks_keeps_one_mark_per_cell() -> None:
    xs = list(range(1000))
    ys = [float(x % 3) for x in xs]

    def cell(x: int, y: float) -> tuple[int, int]:
        return x * 100 // 1000, int(y * 8 / 2.0)

    (kept_x, kept_y), *rest = thin_marks([(xs, ys)], 0, 999, 100, 0.0, 2.0, 8)
    kept_cells = [cell(x, y) for x, y in zip(kept_x, kept_y)]
    assert not rest
    assert sorted(kept_cells) == sorted({cell(x, y) for x, y in zip(xs, ys)})  # 300: 100 x 3


def test_a_long_series_reaches_plotext_thinned_to_the_charts_columns() -> None:
    state = fixture_state(ranks=2, steps=600)
    chart = cluster_charts(state.series, state.rules.exposed_max)["loss"]
    assert len(chart.lines[0].xs) > 400
    handed: list[int] = []

    class Spy(Plot):  # type: ignore[misc]
        def plot(self, *args: Any, **kwargs: Any) -> Any:
            handed.append(len(args[0]))
            return super().plot(*args, **kwargs)

    text = build(Spy(), chart, 52, 20)
    assert handed and sum(handed) <= 2 * (2 * 52)  # braille: 2 pixel columns a cell
    assert len(text.plain.splitlines()) == 20


@sync
async def test_live_charts_take_new_data_one_per_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    run = synthetic_run(RunShape(ranks=4, steps=44))
    late = [m for m in run if not isinstance(m, schema.Hello) and m.step >= 40]
    state = ClusterState()
    state.ingest_all([m for m in run if isinstance(m, schema.Hello) or m.step < 40])
    frame = [0]
    built: list[int] = []  # the frame each chart build happened in
    paint, draw = Screen._compositor_refresh, history_plot.build

    def counted_paint(self: Screen) -> None:  # type: ignore[type-arg]
        frame[0] += 1
        paint(self)

    def logged_build(*args: Any) -> Any:
        built.append(frame[0])
        return draw(*args)

    monkeypatch.setattr(Screen, "_compositor_refresh", counted_paint)
    monkeypatch.setattr(history_plot, "build", logged_build)
    app = ZeroscopeApp(state, live_clock=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(HistoryPlots)
        plots = [p for p in app.screen.query(HistoryPlot) if p.display]
        assert len(plots) == 5 and len(built) >= 5  # shown first: drawn at once
        grid.min_interval_s = 1e-3  # live pace, without a second's wait in a test

        async def new_steps(steps: range) -> list[int]:
            built.clear()
            old = [p.builds for p in plots]
            key = grid._key()
            state.ingest_all([m for m in late if m.step in steps])
            app.redraw()
            assert grid._key() != key  # the series moved
            for _ in range(100):
                await pilot.pause(0.01)
                if all(p.builds > b for p, b in zip(plots, old)):
                    break
            return [p.builds - b for p, b in zip(plots, old)]

        assert await new_steps(range(40, 42)) == [1] * 5
        assert len(built) == 5 and len(set(built)) == 5, built  # five frames, one chart each
        # Replay's pace (the cursor moves in every chart together): one frame, all five; the
        # same counting sees it, so the one-per-frame above is the mechanism, not the probe.
        grid.min_interval_s = 0.0
        assert await new_steps(range(42, 44)) == [1] * 5
        assert len(set(built)) == 1, built


@sync
async def test_live_charts_take_turns_when_data_moves_faster_than_they_catch_up() -> None:
    app = ZeroscopeApp(fixture_state(), live_clock=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(HistoryPlots)
        grid.min_interval_s = 1e-9
        shown = [p.id for p in grid.query(HistoryPlot) if p.display]
        handed = []
        for i in range(2 * len(shown)):
            grid._show(("new data", i))  # every frame brings new data (no await: no paint)
            grid._advance()  # what the frame's paint lets run after it
            plot = grid._in_flight
            assert plot is not None
            handed.append(plot.id)
            grid._drawn(plot)  # its paint: the next new data may go to another chart
        # The chart whose data is oldest goes first: each chart twice, none starved.
        assert handed == shown + shown


@sync
async def test_the_first_data_is_charted_at_once_then_at_the_live_pace() -> None:
    """A live view's charts take new data at most every LIVE_INTERVAL_S: the first data waited
    for it too, so the charts read "NA: nothing reported yet" for their first 10 s while the
    table showed hundreds of steps (a job shorter than that never got a chart)."""
    run = list(synthetic_run(RunShape(ranks=2, steps=12)))
    state = ClusterState()
    app = ZeroscopeApp(state, live_clock=True)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(HistoryPlots)
        grid.min_interval_s = 10.0
        empty = grid._shown_key
        state.ingest_all([m for m in run if getattr(m, "step", 0) < 4])
        app.redraw()
        await pilot.pause(0.2)
        assert grid._shown_key != empty  # drawn now, not 10 s later
        assert any(grid.chart(name).has_data() for name in grid.shown)
        shown = grid._shown_key
        state.ingest_all([m for m in run if 4 <= getattr(m, "step", 0) < 8])
        app.redraw()
        await pilot.pause(0.2)
        assert grid._shown_key == shown  # later data: at the live pace
