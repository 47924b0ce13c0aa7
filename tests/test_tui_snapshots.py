"""SVG snapshots of every screen on the fixture run, at 80x24 and 160x48 (pytest-textual-snapshot).

The fixture has no clocks in it and the app is given no feed, so each frame is a pure function
of the fixture: update with ``pytest tests/test_tui_snapshots.py --snapshot-update``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures import RunShape, synthetic_run
from zeroscope.state import ClusterState
from zeroscope.tui.app import ZeroscopeApp

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
