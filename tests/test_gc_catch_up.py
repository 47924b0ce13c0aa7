"""A viewer's catch-up fold holds Python's cyclic collector off and, for a live snapshot,
freezes what survived (store/gc_pause.py): the collector is running again after it exactly when
it was before, the folded state is out of the collector's sight (frozen, not in any
generation), a dropped frozen state is still freed (it holds no reference cycle), a replay
seek's rebuild is paused but not frozen, and the state's figures are the same as a fold without
the policy, through the TUI's own feed worker."""

from __future__ import annotations

import gc
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import sync
from zeroscope.agent.schema import Message
from zeroscope.state import ClusterState
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.store import gc_pause
from zeroscope.store.gc_pause import catch_up_fold, is_catch_up
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.feed import Batch, LiveFeed


@pytest.fixture
def collector() -> Iterator[None]:
    """Leave the collector as found, and nothing this test froze frozen."""
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def run(ranks: int = 32, steps: int = 6) -> list[Message]:
    return synthetic_run(RunShape(ranks=ranks, steps=steps, collectives=True, straggle_from=1))


SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
"""Reachable from any instance (its class, the class's module...), never the state's own."""


def tracked_ids(root: object) -> set[int]:
    """The collector-tracked objects reachable from ``root`` (walked independently of gc's
    generations: what a whole-heap collection would have to visit for it), its classes and
    modules aside."""
    seen: set[int] = set()
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, SHARED):
            continue
        seen.add(id(obj))
        todo.extend(gc.get_referents(obj))
    return seen


def figures(state: ClusterState) -> tuple[Any, ...]:
    """What the views show of a state: each rank's newest report, summary, history, totals and
    standing; each step's line; the run's summary."""
    ranks = [
        (r.rank, r.latest, r.summary, list(r.history), r.totals, r.slowness, r.host)
        for r in sorted(state.ranks.values(), key=lambda r: r.rank)
    ]
    steps = [step_line(a) for a in state.steps.values()]
    return ranks, steps, summary_lines(state), state.last_complete


@pytest.mark.parametrize("running", [True, False])
def test_the_collector_is_off_during_the_fold_and_as_before_after(
    running: bool, collector: None
) -> None:
    (gc.enable if running else gc.disable)()
    with catch_up_fold():
        assert not gc.isenabled()
    assert gc.isenabled() is running


def test_the_folded_state_is_frozen_out_of_every_generation(collector: None) -> None:
    gc.enable()
    messages = run()
    gc.collect()
    before = gc.get_freeze_count()
    state = ClusterState()
    with catch_up_fold():
        state.ingest_all(messages)
    ids = tracked_ids(state)
    # The state's own objects, not a trivial root: 32 ranks' states, history deques, totals and
    # newest reports (their summaries, OpTotals and standings are untracked, msgspec gc=False:
    # state/rank.py: 619 tracked objects where main left 1,591).
    assert len(ids) > 500
    assert gc.get_freeze_count() - before >= len(ids)
    assert not ids & {id(o) for o in gc.get_objects()}  # no collection walks them


def test_a_dropped_frozen_state_is_freed_it_holds_no_cycle(collector: None) -> None:
    # A replay seek drops the state it froze: reference counting alone must free it (a frozen
    # cycle would never be), or each seek would leak a state.
    state = ClusterState()
    with catch_up_fold():
        state.ingest_all(run())  # the messages are the state's alone, as a viewer's snapshot
    n = len(tracked_ids(state))
    frozen = gc.get_freeze_count()
    del state
    assert frozen - gc.get_freeze_count() >= n


def test_a_fold_cut_short_is_not_frozen_and_restarts_the_collector(collector: None) -> None:
    gc.enable()
    before = gc.get_freeze_count()
    with pytest.raises(KeyboardInterrupt), catch_up_fold():
        _kept = [[i] for i in range(1000)]
        raise KeyboardInterrupt
    assert gc.isenabled()
    assert gc.get_freeze_count() == before


def test_only_big_batches_are_a_catch_up() -> None:
    assert not is_catch_up(gc_pause.CATCH_UP_MESSAGES - 1)
    assert is_catch_up(gc_pause.CATCH_UP_MESSAGES)
    assert is_catch_up(16_384 * 3)  # a 16,384-rank late viewer's snapshot


class OneBatch:
    """A feed whose first poll is the whole catch-up: a late viewer's snapshot (live), or a
    replay's first seek (a rebuild: ``reset``)."""

    def __init__(self, messages: list[Message], live: bool = True) -> None:
        self.messages: list[Message] | None = messages
        self.live = live
        self.frozen_at_poll = -1

    def poll(self, timeout: float) -> Batch | None:
        if self.messages is None:
            time.sleep(timeout)
            return None
        self.frozen_at_poll = gc.get_freeze_count()
        messages, self.messages = self.messages, None
        return Batch(messages, reset=not self.live, snapshot=self.live)


class Snapshots:
    """A source that counts the state snapshots it has taken, as LiveSource does."""

    def __init__(self) -> None:
        self.snapshots = 0
        self.next: list[Message] = []

    def poll(self, timeout: float = 0.1) -> list[Message]:
        out, self.next = self.next, []
        return out


def test_the_live_feed_marks_the_batch_that_holds_a_snapshot() -> None:
    source = Snapshots()
    feed = LiveFeed(source)
    hello, report = run(ranks=1, steps=1)[:2]
    source.next, source.snapshots = [hello], 1  # the snapshot's answer
    first = feed.poll(0)
    source.next = [report]  # then live updates
    second = feed.poll(0)
    assert first is not None and first.snapshot
    assert second is not None and not second.snapshot


@sync
@pytest.mark.parametrize("live", [True, False])
async def test_the_tui_folds_a_catch_up_under_the_policy_to_the_same_figures(
    live: bool, collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    messages = run()
    monkeypatch.setattr(gc_pause, "CATCH_UP_MESSAGES", len(messages))  # small, but a catch-up
    plain = ClusterState()
    plain.ingest_all(messages)
    gc.enable()
    feed = OneBatch(list(messages), live)
    app = ZeroscopeApp(ClusterState(), feed, live_clock=False)
    async with app.run_test(size=(160, 48)) as pilot:
        deadline = time.monotonic() + 30
        while app.state.last_complete != plain.last_complete or feed.messages is not None:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        await pilot.pause(0.2)  # the worker's last hand-off returned: the fold is over
        assert gc.isenabled()
        grown = gc.get_freeze_count() - feed.frozen_at_poll
        if live:  # a late viewer's snapshot: frozen
            assert grown >= len(tracked_ids(app.state))
        else:  # a seek's rebuild, which recurs: paused, never frozen
            assert grown <= 0
            assert id(app.state) in {id(o) for o in gc.get_objects()}
        assert figures(app.state) == figures(plain)
