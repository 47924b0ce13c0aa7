"""The node table draws only the nodes on screen, and what it draws stays right: after every step
the rows shown (the first screen, the last one reached with End, the slowest first when sorted)
read what a brute-force recomputation from the raw reports gives (tests/test_nodes.py's, no
state code), and a frame folds the nodes it draws, not every node of the job."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.fixtures import RunShape, synthetic_run
from tests.test_nodes import brute_force
from tests.test_tui import screen_text, sync
from zeroscope.agent.schema import Hello, Message, StepReport
from zeroscope.state import ClusterState, nodes, units
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.node_table import NodeTable

RANKS = 512
"""64 nodes of 8 ranks (``b`` shows them: the heatmap still fits 80x24): ~10 fit on screen."""


def _steps(run: list[Message]) -> tuple[list[Message], dict[int, list[Message]]]:
    first = [m for m in run if isinstance(m, Hello)]
    by_step: dict[int, list[Message]] = {}
    for m in run:
        if not isinstance(m, Hello):
            by_step.setdefault(m.step, []).append(m)  # type: ignore[union-attr]
    return first, by_step


def _expected_line(key: tuple[int, str], want: dict) -> list[str]:
    """The words of a node's row as the table prints them, from the brute-force figures."""
    slowest, slowness = want["slowest"]
    memory_max, memory_min = want["memory"]
    return [
        key[1],
        str(len(want["ranks"])),
        f"r{slowest}",
        f"{slowness:.2f}x",
        str(want["step"]),
        units.seconds(want["step_time"]),
        units.size(memory_max),
        units.size(memory_min),
        units.percent(want["exposed"]),
    ]


def _shown_rows(app: ZeroscopeApp) -> dict[str, list[str]]:
    """Node name -> the words of its row, for every node row on screen."""
    out = {}
    for line in screen_text(app).splitlines():
        words = line.split()
        if words and words[0].startswith("node") and words[0][4:].isdigit():
            out[words[0]] = words
    return out


@contextmanager
def counting_folds() -> Iterator[list[tuple[int, str]]]:
    """Every node fold (zeroscope.state.nodes.fold) while inside, by node key."""
    folded: list[tuple[int, str]] = []
    real = nodes.fold

    def fold(key, ranks):  # type: ignore[no-untyped-def]
        folded.append(key)
        return real(key, ranks)

    nodes.fold = fold  # type: ignore[assignment]
    try:
        yield folded
    finally:
        nodes.fold = real  # type: ignore[assignment]


@sync
async def test_the_node_rows_on_screen_match_a_brute_force_recomputation_after_every_step() -> None:
    run = synthetic_run(RunShape(ranks=RANKS, steps=4, collectives=True, straggle_from=0))
    hellos_list, by_step = _steps(run)
    hellos = {h.rank: h for h in hellos_list if isinstance(h, Hello)}
    newest: dict[int, StepReport] = {}
    state = ClusterState()
    state.ingest_all(hellos_list)
    app = ZeroscopeApp(state)
    checked = 0
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b")
        for step in sorted(by_step):
            state.ingest_all(by_step[step])
            for m in by_step[step]:
                if isinstance(m, StepReport):
                    newest[m.rank] = m
            expected = brute_force(hellos, newest)
            by_name = {key[1]: (key, want) for key, want in expected.items()}
            app.redraw()
            await pilot.pause()
            table = app.screen.query_one(NodeTable)
            assert app.screen.has_class("nodes") and table.sort_key == "node"
            await pilot.press("home")
            first = _shown_rows(app)
            await pilot.press("end")
            last = _shown_rows(app)
            assert "node0" in first and "node63" in last and "node0" not in last
            for shown in (first, last):
                for name, words in shown.items():
                    key, want = by_name[name]
                    assert words[:9] == _expected_line(key, want), name
                    checked += 1
    assert checked >= 4 * 16


@sync
async def test_sorted_by_slowness_the_slowest_node_comes_first() -> None:
    run = synthetic_run(
        RunShape(ranks=RANKS, steps=4, collectives=True, straggler=300, straggle_from=0)
    )
    hellos = {m.rank: m for m in run if isinstance(m, Hello)}
    newest = {m.rank: m for m in run if isinstance(m, StepReport)}
    expected = brute_force(hellos, newest)
    slowest = max(expected, key=lambda key: (expected[key]["slowest"][1], key))
    state = ClusterState()
    state.ingest_all(run)
    app = ZeroscopeApp(state)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b", "s", "s", "home")  # node -> step -> slowness (slowest first)
        await pilot.pause()
        table = app.screen.query_one(NodeTable)
        assert table.sort_key == "slowness" and table.descending
        assert slowest == (37, "node37") and table.current_key == slowest
        assert table.shown_nodes[0] == "node37"
        words = _shown_rows(app)["node37"]
        assert words[:9] == _expected_line(slowest, expected[slowest])


@sync
async def test_a_frame_folds_the_nodes_it_draws_not_every_node() -> None:
    run = synthetic_run(RunShape(ranks=RANKS, steps=3, collectives=True, straggle_from=0))
    hellos_list, by_step = _steps(run)
    state = ClusterState()
    state.ingest_all(hellos_list + by_step.pop(0))
    app = ZeroscopeApp(state)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("b")
        await pilot.pause()
        for step in sorted(by_step):
            state.ingest_all(by_step[step])  # every node's ranks reported: all 64 are stale
            with counting_folds() as folded:
                app.redraw()
                await pilot.pause()
            drawn = set(_shown_rows(app))
            assert 5 <= len(drawn) < 20
            assert {key[1] for key in folded} == drawn and len(folded) == len(drawn)
        # Sorting by a figure needs every node's: the others are folded, once each (those on
        # screen already were, for this state).
        with counting_folds() as folded:
            await pilot.press("s", "s")
            await pilot.pause()
        assert len(folded) == len(set(folded)) == RANKS // 8 - len(drawn)
        assert not {key[1] for key in folded} & drawn
