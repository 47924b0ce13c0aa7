"""A replay seek in a big job reads one step of reports (the feed's window is bounded to ~4,096
reports), and that one step is enough: the view shows the target step closed and judged exactly
as a replay that folded every step from the start shows it (a step closes once every rank
reported it, not when the next one arrives)."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures import RunShape, synthetic_run, write_trace
from zeroscope.state import ClusterState
from zeroscope.store.trace import TraceReader
from zeroscope.tui.feed import ReplayFeed


def test_a_seek_in_a_4096_rank_trace_reads_one_step_and_closes_it(tmp_path: Path) -> None:
    shape = RunShape(ranks=4096, steps=4, straggle_from=2, overflow_steps=(), drops_at=-1)
    run = synthetic_run(shape)
    path = tmp_path / "big.zstrace"
    write_trace(path, run)
    feed = ReplayFeed(TraceReader(path), paused=True)
    assert feed.window == 1
    feed.poll(0)
    target = feed.last - 1
    feed.goto(target)
    batch = feed.poll(0)
    assert batch is not None and batch.reset
    steps_read = {m.step for m in batch.messages if type(m).__name__ == "StepReport"}
    assert steps_read == {target}
    seeked = ClusterState()
    seeked.ingest_all(batch.messages)
    # The oracle: every message of the run up to the target, folded from the start.
    whole = ClusterState()
    whole.ingest_all([m for m in run if getattr(m, "step", 0) <= target])
    got, want = seeked.latest(), whole.latest()
    assert got is not None and want is not None
    assert got.step == want.step == target
    assert got.complete and want.complete
    assert got.step_time == want.step_time and got.exposed_s == want.exposed_s
    assert got.summaries == want.summaries
    assert got.standings == want.standings  # each rank judged (straggler or not) alike
    assert len(want.standings) == shape.ranks  # every rank judged in the oracle too
