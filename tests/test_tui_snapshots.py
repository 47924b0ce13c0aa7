"""SVG snapshots of every screen on the fixture run, at 80x24 and 160x48 (pytest-textual-snapshot);
the history plots live and in replay, with 2 and 64 ranks.

The fixture has no clocks in it and the app is given no feed, so each frame is a pure function
of the fixture: update with ``pytest tests/test_tui_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures import MemoryTrace, RunShape, synthetic_run
from zeroscope.state import ClusterState
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.feed import ReplayFeed

SIZES = [(80, 24), (160, 48)]
SCREENS = {
    "cluster": [],
    "rank": ["down", "down", "down", "enter"],  # rank 3, the straggler
    "memory": ["m"],
    "comm": ["c"],
    "loss_scale": ["l"],
}


def fixture_app() -> ZeroscopeApp:
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=4, steps=40)))
    return ZeroscopeApp(state)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen_snapshot(snap_compare: Any, screen: str, size: tuple[int, int]) -> None:
    assert snap_compare(fixture_app(), press=SCREENS[screen], terminal_size=size)


def ranks_app(ranks: int) -> ZeroscopeApp:
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=ranks, steps=40)))
    return ZeroscopeApp(state)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ranks", [2, 64])
@pytest.mark.parametrize("screen", ["cluster", "rank"])
def test_history_plots_snapshot(
    snap_compare: Any, screen: str, ranks: int, size: tuple[int, int]
) -> None:
    """Live: the cluster screen's plots beside a table (2 ranks) or a heatmap (64 ranks), and
    the last rank's (the straggler's) detail beside the cluster median."""

    async def open_rank(pilot: Any) -> None:
        if screen == "rank":
            pilot.app.open_rank(ranks - 1)
        await pilot.pause()

    assert snap_compare(ranks_app(ranks), terminal_size=size, run_before=open_rank)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("ranks", [2, 64])
def test_replay_plots_snapshot(snap_compare: Any, ranks: int, size: tuple[int, int]) -> None:
    """Replay paused at step 20 of 40: the whole run plotted, the cursor at step 20."""
    feed = ReplayFeed(MemoryTrace(synthetic_run(RunShape(ranks=ranks))), start_step=20, paused=True)
    app = ZeroscopeApp(ClusterState(), feed, refresh_s=0.05)

    async def loaded(pilot: Any) -> None:
        for _ in range(200):
            await pilot.pause(0.05)
            if app.run_series is not None and app.cursor == 20 and app.settled:
                break
        await pilot.pause(0.3)

    assert snap_compare(app, terminal_size=size, run_before=loaded)
