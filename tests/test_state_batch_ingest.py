"""A batch folded by ``ClusterState.ingest_all`` leaves the state exactly as the same messages
folded one call at a time: the batch loop keeps the step of the reports before each one, and
must let it go wherever a step closes, a step is evicted, or another message comes between.
The runs have late reports of closed steps, missing reports, drops, reports of ranks that said
no Hello, and a history shorter than the run (steps evicted while open)."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from tests.fixtures import RunShape, synthetic_run
from zeroscope.agent.schema import Hello, Message, StepReport
from zeroscope.state import ClusterState
from zeroscope.state.rank import RankState


def _figures(x: object) -> object:
    """Every figure of a state object as plain data (NaN made comparable)."""
    if isinstance(x, float):
        return "nan" if math.isnan(x) else x
    if isinstance(x, msgspec.Struct):
        return (type(x).__name__, [_figures(getattr(x, f)) for f in x.__struct_fields__])
    if hasattr(x, "__dataclass_fields__"):
        return (type(x).__name__, [_figures(getattr(x, f)) for f in x.__dataclass_fields__])
    if isinstance(x, dict):
        return [(k, _figures(v)) for k, v in x.items()]
    if isinstance(x, (set, frozenset)):
        return sorted(x)
    if isinstance(x, (list, tuple)) or type(x).__name__ == "deque":
        return [_figures(v) for v in x]  # type: ignore[attr-defined]
    return x


def _rank(r: int, rs: RankState) -> object:
    totals = _figures(rs.totals)
    return (
        r,
        _figures(rs.summary),
        _figures(rs.history),
        totals,
        rs.slowness,
        rs.dropped,
        rs.last_seen_s,
    )


def _state(st: ClusterState) -> object:
    ranks = [_rank(r, rs) for r, rs in st.ranks.items()]
    steps = [
        [s, a.complete, sorted(a.summaries), a.samples, a.skipped, _figures(a.standings)]
        + ([a.step_time, a.median_time, a.exposed_s] if a.summaries else [])
        for s, a in st.steps.items()
    ]
    c = st.conditions
    return (
        ranks,
        steps,
        _figures(list(st.series.points)),
        _figures(st.findings()),
        (sorted(c.low), sorted(c.byes), sorted(c.dropping), c.silent(st.clock_s + 60, 1.0)),
        (st.messages, st.version, st.steps_completed, st.last_complete, st.clock_s),
        (st.world_size, st.job_id, len(st.events)),
    )


def _rough(run: list[Message], rng: random.Random) -> list[Message]:
    """The run with some reports missing, some with drops, some arriving 1-3 steps late, and
    one rank's Hello lost (its reports come from a rank no Hello placed)."""
    out: list[Message] = []
    late: list[tuple[int, Message]] = []
    for m in run:
        if isinstance(m, Hello) and m.rank == 1:
            continue
        if isinstance(m, StepReport):
            k = rng.random()
            if k < 0.03:
                continue
            if k < 0.06:
                m = msgspec.structs.replace(m, dropped=rng.randrange(1, 4))
            elif k < 0.10:
                late.append((len(out) + rng.randrange(1, 40), m))
                continue
        out.append(m)
        while late and late[0][0] <= len(out):
            out.append(late.pop(0)[1])
    return out + [m for _, m in late]


@pytest.mark.parametrize("history", [4, 512])
@pytest.mark.parametrize(
    "shape",
    [
        RunShape(ranks=8, steps=24, straggle_from=3),
        RunShape(ranks=13, steps=16, work=True, straggle_from=1, collectives=False),
    ],
    ids=["zero3", "work"],
)
def test_a_batch_folds_as_one_message_at_a_time(shape: RunShape, history: int) -> None:
    rng = random.Random(shape.ranks * history)
    run = _rough(synthetic_run(shape), rng)
    one = ClusterState(history_steps=history)
    closed_one = [a.step for m in run for a in one.ingest(m)]
    for size in (2, 7, 64, len(run)):
        batched = ClusterState(history_steps=history)
        closed = [
            a.step for i in range(0, len(run), size) for a in batched.ingest_all(run[i : i + size])
        ]
        assert closed == closed_one, size
        assert _state(batched) == _state(one), size
    assert closed_one and one.steps_completed >= shape.steps // 2  # the rough run still closes

    # The live path: a batch arrives at one receive time, as the view folds it; the node
    # table, read after each batch, is what refolding every node gives (a node a batch left
    # unmarked would keep its figures from before).
    live_one = ClusterState(history_steps=history)
    live = ClusterState(history_steps=history)
    for i in range(0, len(run), 3):  # fewer than a step's reports: most batches close none
        for m in run[i : i + 3]:
            live_one.ingest(m, 1000.0 + i)
        live.ingest_all(run[i : i + 3], 1000.0 + i)
        kept = _figures(live.nodes.figures(live.ranks))
        live.nodes.touch_all()
        assert kept == _figures(live.nodes.figures(live.ranks)), i
    assert _state(live) == _state(live_one)
