"""Pilot tests of the cluster screen's node rows: shown when neither the rank table nor the
heatmap fits a many-node job (or on ``b``), Enter drills into a node's ranks, Escape comes back."""

from __future__ import annotations

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import screen_text, sync
from zeroscope.state import ClusterState
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.node_table import NodeTable
from zeroscope.tui.rank_screen import RankScreen
from zeroscope.tui.rank_table import RankTable


def state_of(ranks: int, steps: int = 3, collectives: bool = False) -> ClusterState:
    """The fixture run; with collectives the last rank is a straggler the others wait for."""
    state = ClusterState()
    state.ingest_all(
        synthetic_run(RunShape(ranks=ranks, steps=steps, collectives=collectives, straggle_from=0))
    )
    return state


@sync
async def test_a_job_the_heatmap_cannot_hold_is_shown_a_node_a_row() -> None:
    # 1024 ranks at 2 cells each need 26 lines at 80 columns: more than 80x24 has.
    app = ZeroscopeApp(state_of(1024))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        nodes = screen.query_one(NodeTable)
        assert screen.has_class("nodes") and not screen.has_class("heatmap")
        assert app.focused is nodes and nodes.display and not screen.query_one(RankTable).display
        text = screen_text(app)
        assert "node0 " in text and "slowest" in text and "mem max" in text
        assert len(nodes.shown_nodes) == 128
        await pilot.press("end")
        assert "node127 " in screen_text(app) and "node0 " not in screen_text(app)


@sync
async def test_the_straggler_s_node_names_it_and_sorts_first_by_alerts() -> None:
    app = ZeroscopeApp(state_of(64, steps=8, collectives=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("b", "s", "s", "s", "s", "s")
        await pilot.pause()
        nodes = app.screen.query_one(NodeTable)
        assert nodes.sort_key == "alerts" and nodes.shown_nodes[0] == "node7"
        line = next(s for s in screen_text(app).splitlines() if s.startswith("node7 "))
        # The same figure the rank table shows for r63 (its compute, 1.45x slower in the
        # fixture, against the others' median).
        assert f"r63 {app.state.slowness(63):.2f}x" in line and "r63 1.3" in line
        assert line.rstrip().endswith("1 slow r63")


@sync
async def test_enter_drills_into_a_node_and_escape_comes_back() -> None:
    app = ZeroscopeApp(state_of(64))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert not screen.has_class("nodes")  # 64 ranks: the heatmap still holds them
        await pilot.press("b")
        await pilot.pause()
        nodes = screen.query_one(NodeTable)
        assert screen.has_class("nodes") and app.focused is nodes
        assert nodes.shown_nodes == [f"node{i}" for i in range(8)]
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        table = screen.query_one(RankTable)
        assert app.focused is table and not screen.has_class("nodes")
        assert table.shown_ranks == list(range(16, 24))
        assert "node node2: 8 ranks" in screen_text(app)
        await pilot.press("down", "enter")
        assert isinstance(app.screen, RankScreen) and app.screen.rank == 17
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen and table.shown_ranks == list(range(16, 24))
        await pilot.press("escape")
        await pilot.pause()
        assert screen.has_class("nodes") and app.focused is nodes
        assert nodes.current_key == (2, "node2")  # back on the node it left
        assert "node node2" not in screen_text(app)
        await pilot.press("b")
        await pilot.pause()
        assert not screen.has_class("nodes") and len(table.shown_ranks) == 64


@sync
async def test_a_small_job_keeps_its_rank_table() -> None:
    app = ZeroscopeApp(state_of(16))  # two nodes, but the table fits
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert not screen.has_class("nodes") and not screen.has_class("heatmap")
        assert screen.query_one(RankTable).shown_ranks == list(range(16))
    app = ZeroscopeApp(state_of(4))  # one node: no node rows to show
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b")
        await pilot.pause()
        assert not app.screen.has_class("nodes")
        assert app.screen.query_one(RankTable).shown_ranks == list(range(4))
