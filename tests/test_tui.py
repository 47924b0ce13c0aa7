"""Pilot tests: every screen and key of the TUI, on the deterministic fixture run."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from textual.command import CommandPalette

from tests.fixtures import MemoryTrace, RunShape, synthetic_run
from zeroscope.state import ClusterState, units
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.cluster_screen import ClusterScreen
from zeroscope.tui.comm_screen import CommScreen
from zeroscope.tui.dialogs import GotoStepScreen, HelpScreen, QuitScreen
from zeroscope.tui.feed import ReplayFeed
from zeroscope.tui.heatmap import RankHeatmap
from zeroscope.tui.loss_scale_screen import LossScaleScreen
from zeroscope.tui.memory_screen import MemoryScreen
from zeroscope.tui.pane import Pane
from zeroscope.tui.rank_screen import RankScreen
from zeroscope.tui.rank_table import RankTable


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async Pilot test with asyncio.run (no pytest-asyncio plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def fixture_state(ranks: int = 4, steps: int = 40) -> ClusterState:
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=ranks, steps=steps)))
    return state


def screen_text(app: ZeroscopeApp) -> str:
    """What the terminal shows, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@sync
async def test_cluster_screen_lists_every_rank_with_its_figures() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        for r in range(4):
            assert f"r{r} " in text
        assert "ZeRO-3 fp16 offload cpu" in text and "step 39" in text
        assert "straggler r3" in text and "agent dropped 3 messages on r1" in text
        assert "1.37x" in text  # rank 3's compute vs the median of the others'


@sync
async def test_cursor_sort_filter_and_drill_down() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        table = app.screen.query_one(RankTable)
        await pilot.press("j", "j", "down", "k")
        assert table.current_rank == 2
        await pilot.press("s")  # memory, biggest first
        assert table.sort_key == "memory" and table.descending
        totals = [app.state.ranks[r].summary.device_total for r in table.shown_ranks]  # type: ignore[union-attr]
        assert totals == sorted(totals, reverse=True)
        await pilot.press("s", "s")  # slowness (compute vs the others'): the straggler leads
        assert table.sort_key == "slowness" and table.shown_ranks[0] == 3
        await pilot.press("slash", "3", "enter")
        assert table.shown_ranks == [3]
        await pilot.press("escape")
        assert len(table.shown_ranks) == 4
        table.cursor = table.shown_ranks.index(1)
        await pilot.press("enter")
        assert isinstance(app.screen, RankScreen) and app.screen.rank == 1
        text = screen_text(app)
        assert "rank 1" in text and "rank 1 beside the cluster over steps" in text
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)


@sync
async def test_rank_detail_panes_and_tab() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(120, 60)) as pilot:
        app.open_rank(3)
        await pilot.pause()
        text = screen_text(app)
        assert "all_gather" in text and "reduce_scatter" in text  # timeline lanes + op table
        assert "d2h" in text and "h2d" in text  # offload transfers
        summary = app.state.ranks[3].summary
        assert summary is not None
        count = summary.ops["all_gather"].count
        assert any(
            line.split()[1:3] == ["all_gather", str(count)]
            for line in text.splitlines()
            if "all_gather" in line and len(line.split()) > 3
        )
        first = app.focused
        await pilot.press("tab")
        assert isinstance(app.focused, Pane) and app.focused is not first


def test_every_collected_figure_has_a_place_na_where_absent() -> None:
    from zeroscope.tui.rank_figures import rank_figures

    state = fixture_state()
    text = rank_figures(state.ranks[3], 200).plain
    # The fixture's stage-3 gathered parameters, prefetches, grad norm, host sampler figures.
    report = state.ranks[3].latest
    assert report is not None
    prefetched = sum(c.prefetched for c in report.collectives)
    for needle in (
        "gathered P   8.0MB",
        f"prefetched   {prefetched} ",
        "grad norm    1.01",
        "rss          1.1GB",
        "cpu          ",
        "host O       36.0MB",
        "NVMe         0B",
    ):
        assert needle in text, needle
    # Measured nowhere in the fixture (CPU, no NVML): NA, never 0.
    for needle in ("dev peak     NA", "gpu util     NA", "gpu power    NA", "pcie tx      NA"):
        assert needle in text, needle


def test_the_phase_row_draws_each_span_where_it_ran() -> None:
    from zeroscope.agent.schema import PhaseSpan, StepReport
    from zeroscope.tui.rank_screen import _phase_row

    # Accumulation: forward, backward, forward, backward, then the optimizer, on a 1 s axis.
    spans = [("forward", 0.0, 0.2), ("backward", 0.2, 0.2), ("forward", 0.4, 0.2),
             ("backward", 0.6, 0.2), ("optimizer", 0.8, 0.2)]  # fmt: skip
    report = StepReport(
        rank=0, step=1, wall_ns=0, duration_s=1.0,
        phase_spans=[PhaseSpan(name=n, start_s=a, duration_s=d) for n, a, d in spans],
    )  # fmt: skip
    assert _phase_row(report, 1.0, 10).plain == "FFBBFFBBOO"


@pytest.mark.parametrize(
    ("key", "screen", "needle"),
    [
        ("m", MemoryScreen, "measured / predicted"),
        ("c", CommScreen, "predicted 72.0MB (1.00x)"),
        ("l", LossScaleScreen, "5 of 40 steps skipped"),
    ],
)
@sync
async def test_screens_by_key(key: str, screen: type, needle: str) -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press(key)
        assert isinstance(app.screen, screen)
        assert needle in screen_text(app)
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)


@sync
async def test_memory_screen_predicted_matches_measured_for_the_fixture() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("m")
        rows = [
            line
            for line in screen_text(app).splitlines()
            if line.strip("│ ")[:2] in ("r0", "r1", "r2", "r3")
        ]
        assert len(rows) == 4
        # By hand, not by the formulas under test: the fixture's Ψ = 12e6 on N = 4 ranks at
        # ZeRO-3 fp16 with the optimizer offloaded holds P = 2Ψ/N = 6.0 MB on each device (its
        # gradient and optimizer shards live on the host), and the prediction says the same.
        assert units.size(2 * 12_000_000 / 4) == "6.0MB"
        assert all(row.count("6.0MB/6.0MB") == 1 and "+0%" in row for row in rows), rows


@sync
async def test_help_and_command_palette() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"loss scale")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, LossScaleScreen)


@sync
async def test_heatmap_when_ranks_do_not_fit() -> None:
    app = ZeroscopeApp(fixture_state(ranks=256, steps=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert screen.has_class("heatmap")
        heat = screen.query_one(RankHeatmap)
        assert app.focused is heat
        await pilot.press("down")
        assert heat.current_rank == heat._per_line  # one line of cells down
        await pilot.press("enter")
        assert isinstance(app.screen, RankScreen) and app.screen.rank == heat._per_line
        await pilot.press("escape", "v")
        assert not app.screen.has_class("heatmap")


class _Running:
    returncode: int | None = None


@sync
async def test_quit_asks_while_the_job_runs() -> None:
    job = _Running()
    app = ZeroscopeApp(fixture_state(), job=job)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)
        await pilot.press("q", "d")
    assert app.return_value == "detach"
    job.returncode = 0
    app = ZeroscopeApp(fixture_state(), job=job)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
    assert app.return_value == "quit"


@pytest.mark.parametrize(
    ("keys", "chosen"),
    [(("enter",), "detach"), (("right", "enter"), "cancel"), (("left", "enter"), "stop")],
)
@sync
async def test_quit_then_enter_leaves_the_job_running(keys: tuple[str, ...], chosen: str) -> None:
    """The dialog's focus starts on "Leave running" (it was on "Stop the job": ``q`` then Enter
    stopped a user's training run, exit 130), and the arrow keys move it."""
    job = _Running()
    app = ZeroscopeApp(fixture_state(), job=job)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        await pilot.press(*keys)
        await pilot.pause()
        if chosen == "cancel":
            assert isinstance(app.screen, ClusterScreen)
            await pilot.press("q", "s")
            chosen = "stop"
    assert app.return_value == chosen


@sync
async def test_replay_keys_pause_step_speed_goto() -> None:
    feed = ReplayFeed(MemoryTrace(synthetic_run()), start_step=10, paused=True)
    app = ZeroscopeApp(ClusterState(), feed, refresh_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.4)
        assert feed.position == 10 and app.state.latest().step == 10  # type: ignore[union-attr]
        await pilot.press("right", "right")
        await pilot.pause(0.4)
        assert feed.position == 12 and app.state.latest().step == 12  # type: ignore[union-attr]
        await pilot.press("left")
        await pilot.pause(0.4)
        assert feed.position == 11 and app.state.latest().step == 11  # type: ignore[union-attr]
        await pilot.press("right_square_bracket", "right_square_bracket")
        assert feed.speed == 4.0
        await pilot.press("left_square_bracket")
        assert feed.speed == 2.0
        await pilot.press("g")
        assert isinstance(app.screen, GotoStepScreen)
        await pilot.press("3", "5", "enter")
        await pilot.pause(0.4)
        assert feed.position == 35 and app.state.latest().step == 35  # type: ignore[union-attr]
        assert "REPLAY ⏸ paused 2x  step 35/39" in screen_text(app)
        await pilot.press("space")
        assert not feed.paused
        await pilot.pause(1.5)
        assert feed.position == 39  # played to the end at 8 steps/s
        assert app.state.latest().step == 39  # type: ignore[union-attr]


@sync
async def test_missing_figures_show_na_not_zero() -> None:
    app = ZeroscopeApp(ClusterState())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert "waiting for ranks" in text and "step NA" in text and "NA steps/s" in text


def test_the_header_keeps_its_status_at_80_columns_under_a_filter() -> None:
    """At 80 columns the header wraps and shows two lines: the status (REPLAY, job exited)
    must be on them even when the filter's long segment pushes the rest to a third."""
    from zeroscope.tui.header import header_text

    state = fixture_state(ranks=64)
    state.engine = "deepspeed"  # an attached DeepSpeed job: its name leads the config segment
    for status in ("REPLAY ⏸ paused 2x  step 35/39", "job exited (1)"):
        lines = header_text(state, status, width=80, shown=(3, 64)).plain.splitlines()
        assert status in "\n".join(lines[:2]), lines


class _Trickle:
    """A live source handing over a run's messages a few at a time (the collector's queue)."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = list(messages)
        self.taken: list[Any] = []

    def poll(self, timeout: float = 0.1) -> list[Any]:
        batch, self.messages = self.messages[:7], self.messages[7:]
        self.taken += batch
        return batch


@pytest.mark.parametrize("pause_s", [0.0, 0.05, 0.3])
@sync
async def test_messages_the_view_took_but_never_folded_are_handed_back(pause_s: float) -> None:
    """The view's feed worker takes messages from the source and hands them to the UI thread;
    when the view closes in between ("Leave running"), ``zeroscope run`` folds what is left
    itself: it had lost them (its headless lines said "no report of steps 22-23 reached
    zeroscope" while the trace held them). Whenever the view closes, the messages it folded
    and those handed back are every message taken, once each, in order."""
    from zeroscope.tui.feed import LiveFeed

    run = list(synthetic_run(RunShape(ranks=4, steps=40)))
    source = _Trickle(run)
    feed = LiveFeed(source)
    folded: list[Any] = []
    state = ClusterState()
    original = state.ingest_all

    def ingest_all(messages: Any, now: float | None = None) -> Any:
        folded.extend(messages)
        return original(messages, now)

    state.ingest_all = ingest_all  # type: ignore[method-assign]
    app = ZeroscopeApp(state, feed)
    async with app.run_test(size=(80, 24)) as pilot:
        await asyncio.sleep(pause_s)
        await pilot.press("q")
    left = feed.unapplied()
    assert folded + left == source.taken


@sync
async def test_replay_advice_says_which_steps_it_judged() -> None:
    """A replay holds a window of the run around its cursor: its advice judged that window
    (an overflow storm in 64 steps) while ``zeroscope advise`` judged the whole run (none),
    and said nothing of it. The advice screen names the steps it judged; live it does not."""
    feed = ReplayFeed(MemoryTrace(synthetic_run()), start_step=30, paused=True)
    app = ZeroscopeApp(ClusterState(), feed, refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.4)
        await pilot.press("a")
        await pilot.pause(0.2)
        done = app.state.complete_steps()
        text = screen_text(app)
        assert f"judged on steps {done[0].step}-{done[-1].step}, the replay's window" in text
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("a")
        await pilot.pause(0.2)
        assert "judged on steps" not in screen_text(app)
