"""A rank's per-step figures (StepSummary, its ``ops`` dict and OpTotals, and its Standing in a
closed step) are made once per report and kept 512 steps a rank, so they are kept out of the
cyclic garbage collector's sight (msgspec ``gc=False``; zeroscope/state/rank.py and
stragglers.py say why): a whole-heap collection of a 16,384-rank view walked millions of them
for nothing. Reference counting still frees them."""

from __future__ import annotations

import gc
import sys

import msgspec

from tests.fixtures import RunShape, split_by_step, synthetic_run
from zeroscope.agent.schema import StepReport, Work
from zeroscope.state import ClusterState
from zeroscope.state.rank import OpTotals, StepSummary, summarize
from zeroscope.state.stragglers import Standing


def test_a_summary_its_ops_and_their_totals_are_untracked() -> None:
    run = synthetic_run(RunShape(ranks=4, steps=2, collectives=True))
    report = [m for m in run if isinstance(m, StepReport)][-1]
    report = msgspec.structs.replace(report, work=Work(tokens=1024))
    s = summarize(report)
    assert s.ops and s.work is report.work
    assert not gc.is_tracked(s)
    assert not gc.is_tracked(s.ops)
    assert not any(gc.is_tracked(o) for o in s.ops.values())
    copy = msgspec.structs.replace(s, duration_s=2 * s.duration_s)
    assert not gc.is_tracked(copy) and copy.ops is s.ops


def test_a_folded_state_shows_the_collector_none_of_its_summaries() -> None:
    hellos, by_step = split_by_step(synthetic_run(RunShape(ranks=16, steps=4, collectives=True)))
    state = ClusterState()
    for step in sorted(by_step):
        state.ingest_all(hellos + by_step[step] if step == 0 else by_step[step])
    assert sum(len(r.history) for r in state.ranks.values()) == 16 * 4
    assert all(len(a.standings) == 16 for a in state.complete_steps())
    seen = [o for o in gc.get_objects() if type(o) in (StepSummary, OpTotals, Standing)]
    assert seen == []
    # ... and reference counting still frees them: dropping a reference is seen at once.
    summary = state.ranks[0].history[0]
    held = sys.getrefcount(summary)
    state.ranks[0].history.popleft()
    assert sys.getrefcount(summary) == held - 1
