"""The view's leaner ingest keeps every figure: a report's collectives folded equal a
brute-force recomputation from the definitions; the straggler judgement's medians (three cases
found once) equal statistics.median over the other ranks; the lag book's flags (counts kept as
entries come and go) equal the rule re-applied to each rank's whole window; and a run with a
straggler and a memory outlier is judged as its reference fold says."""

from __future__ import annotations

import random
import statistics

import msgspec
import pytest

from tests.fixtures import RunShape, synthetic_run
from zeroscope.agent.schema import Collective, Hello, StepReport
from zeroscope.state import AlertRules, ClusterState
from zeroscope.state.collective_fold import fold, union_seconds
from zeroscope.state.rank import summarize
from zeroscope.state.stragglers import LagBook, Standing, _judge_bisecting, judge

OPS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast")


def _factor(op: str, n: int) -> float:
    """nccl-tests' bus factor, written out here (PERFORMANCE.md), not read from the code."""
    n = max(1, n)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


def _union(spans: list[tuple[float, float]]) -> float:
    """Covered length by sweeping the sorted endpoints (an independent union)."""
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    depth, covered, since = 0, 0.0, 0.0
    for x, d in events:
        if depth == 0 and d == 1:
            since = x
        depth += d
        if depth == 0 and d == -1:
            covered += x - since
    return covered


def _collectives(rng: random.Random, n: int, *, odd: bool) -> list[Collective]:
    """``n`` collectives of a few ops and group sizes, overlapping, some out of issue order;
    ``odd``: some untimed, unmeasured or 0-second ones too (the per-collective path)."""
    out, t = [], 0.0
    for i in range(n):
        op = OPS[i % 3] if i % 7 else "broadcast"
        size = 8 if i % 5 else 4
        d = rng.uniform(0.001, 0.01)
        c = Collective(
            op, 1 << rng.randrange(10, 20), size, t, d, d * rng.random(), i % 2 == 0, f"L{i % 4}"
        )
        if odd and i % 6 == 1:
            c = msgspec.structs.replace(c, clock="none")
        if odd and i % 6 == 2:
            c = msgspec.structs.replace(c, exposed_measured=False)
        if odd and i % 6 == 3:
            c = msgspec.structs.replace(c, duration_s=0.0, exposed_s=0.0)
        out.append(c)
        t += rng.uniform(-0.002, 0.006)  # overlaps, and now and then an earlier start
    return out


def _brute(colls: list[Collective]) -> dict[str, object]:
    """Every figure summarize derives from the collectives, from their definitions."""
    ops: dict[str, dict[str, float]] = {}
    for c in colls:
        o = ops.setdefault(
            c.op, {"count": 0, "nbytes": 0, "volume": 0, "seconds": 0.0, "exposed": 0.0, "bus": 0.0}
        )
        o["count"] += 1
        o["nbytes"] += c.nbytes
        o["volume"] += 2 * c.nbytes if c.op == "all_reduce" else c.nbytes
        if c.clock != "none":
            o["seconds"] += c.duration_s
            if c.exposed_measured:
                o["exposed"] += c.exposed_s
            if c.duration_s > 0:
                o["bus"] += c.nbytes * _factor(c.op, c.group_size)
    timed = [c for c in colls if c.clock != "none"]
    return {
        "ops": ops,
        "busy": _union([(c.start_s, c.start_s + c.duration_s) for c in timed]),
        "untimed": sum(c.clock == "none" for c in colls),
        "unexposed": sum(c.clock == "none" or not c.exposed_measured for c in colls),
        "prefetched": sum(c.prefetched for c in colls),
    }


@pytest.mark.parametrize("odd", [False, True])
@pytest.mark.parametrize("n", [0, 1, 2, 18, 60])
def test_a_reports_collectives_fold_to_their_definitions(n: int, odd: bool) -> None:
    rng = random.Random(n * 2 + odd)
    for _ in range(3):
        colls = _collectives(rng, n, odd=odd)
        report = StepReport(rank=0, step=1, wall_ns=1, duration_s=0.2, collectives=colls)
        s, want = summarize(report), _brute(colls)
        assert set(s.ops) == set(want["ops"])  # type: ignore[arg-type]
        for op, o in want["ops"].items():  # type: ignore[attr-defined]
            got = s.ops[op]
            assert (got.count, got.nbytes, got.volume) == (o["count"], o["nbytes"], o["volume"])
            assert got.seconds == pytest.approx(o["seconds"], rel=1e-12)
            assert got.exposed_s == pytest.approx(o["exposed"], rel=1e-12)
            assert got.bus_bytes == pytest.approx(o["bus"], rel=1e-12)
        assert s.busy_s == pytest.approx(want["busy"], rel=1e-12, abs=1e-15)
        assert (s.untimed, s.unexposed, s.prefetched) == (
            want["untimed"],
            want["unexposed"],
            want["prefetched"],
        )
        assert s.collectives == n


@pytest.mark.parametrize("odd", [False, True])
def test_the_busy_union_swept_in_the_fold_equals_the_sorted_union(odd: bool) -> None:
    """The fold sweeps the busy union in its one pass (the timed spans in issue order) and sorts
    only when a start goes backwards: either way the very float union_seconds makes of the
    spans, and the independent sweep's figure."""
    rng = random.Random(11 + odd)
    for n in (1, 2, 5, 18, 60):
        for _ in range(5):
            colls = _collectives(rng, n, odd=odd)
            in_order = sorted(colls, key=lambda c: c.start_s)
            for cs in (colls, in_order):
                spans = [(c.start_s, c.start_s + c.duration_s) for c in cs if c.clock != "none"]
                busy = fold(cs, 0).busy_s
                assert busy == union_seconds(list(spans))
                assert busy == pytest.approx(_union(spans), rel=1e-12, abs=1e-15)


def test_the_fingerprint_tells_sequences_apart_by_op_size_and_label_only() -> None:
    rng = random.Random(5)
    colls = _collectives(rng, 12, odd=False)
    retimed = [msgspec.structs.replace(c, duration_s=c.duration_s * 2) for c in colls]
    regrouped = [msgspec.structs.replace(c, group_size=c.group_size + 1) for c in colls]
    relabelled = [*colls[:-1], msgspec.structs.replace(colls[-1], label="other")]
    base = fold(colls, 0).sequence
    assert base != 0
    assert fold(retimed, 0).sequence == base == fold(regrouped, 0).sequence
    assert fold(relabelled, 0).sequence != base
    assert fold(colls, 1).sequence == 0  # unfinished collectives: not comparable


def test_judge_medians_equal_the_median_of_the_other_ranks() -> None:
    rng = random.Random(3)
    report = StepReport(rank=0, step=1, wall_ns=1, duration_s=0.1)
    base = summarize(report)
    for n in range(2, 12):
        for _ in range(20):
            # a few distinct values, so ties are common
            summaries = {
                r: msgspec.structs.replace(
                    base,
                    duration_s=rng.choice((0.1, 0.12, 0.15, 0.2)),
                    exposed_s=rng.choice((0.0, 0.01, 0.03)),
                    busy_s=rng.choice((0.02, 0.05, 0.07)),
                )
                for r in range(n)
            }
            got = judge(summaries)
            compute = {r: s.compute_s for r, s in summaries.items()}
            # own collective time: busy less the wait for the slowest other rank's compute
            own = {
                r: s.busy_s - max(0.0, max(c for q, c in compute.items() if q != r) - compute[r])
                for r, s in summaries.items()
            }
            for r in summaries:
                median = statistics.median(c for q, c in compute.items() if q != r)
                link_median = statistics.median(v for q, v in own.items() if q != r)
                # exactly: the same values' median, whichever way it is found
                assert got[r].compute_excess_s == compute[r] - median
                assert got[r].link_excess_s == own[r] - link_median
                assert got[r].slowness == (compute[r] / median if median > 0 else None)


def test_a_step_with_a_nan_time_is_judged_by_bisection_as_before() -> None:
    """NaN sorts nowhere, so the thresholds' comparisons would not be the bisection's: such a
    step (a broken report) takes the bisecting path, whose answers it always had."""
    base = summarize(StepReport(rank=0, step=1, wall_ns=1, duration_s=0.1))
    times = (0.1, float("nan"), 0.15, 0.12, 0.2)
    summaries = {r: msgspec.structs.replace(base, duration_s=t) for r, t in enumerate(times)}
    compute = [s.compute_s for s in summaries.values()]
    own = list(judge(summaries).values())
    cs = sorted(compute)
    top, second = cs[-1], cs[-2]
    links = [
        s.busy_s - max(0.0, (second if c == top else top) - c)
        for s, c in zip(summaries.values(), compute, strict=True)
    ]
    want = _judge_bisecting(list(summaries), compute, links, cs, sorted(links))
    assert repr(own) == repr(list(want.values()))


def _flags_by_definition(
    history: dict[int, list[tuple[int, float, float]]], rules: AlertRules, limit: float
) -> dict[tuple[int, str], int]:
    """Each rank's standing flags re-derived from its whole history of (step, compute excess,
    link excess): a kind stands while ``straggler_steps`` of the last ``straggler_window`` steps
    are over, since the first over-step in the window when it was raised; a straggler is not
    also a slow link."""
    out = {}
    for r, entries in history.items():
        since: dict[str, int] = {}
        for k in range(len(entries)):
            window = entries[max(0, k + 1 - rules.straggler_window) : k + 1]
            for kind, i in (("straggler", 1), ("slow_link", 2)):
                overs = [e[0] for e in window if e[i] > limit]
                if len(overs) >= rules.straggler_steps:
                    since.setdefault(kind, overs[0])
                else:
                    since.pop(kind, None)
            if "straggler" in since:
                since.pop("slow_link", None)
        out.update({(r, kind): step for kind, step in since.items()})
    return out


def test_the_lag_books_flags_equal_the_rule_over_each_ranks_window() -> None:
    rules = AlertRules()
    limit = rules.straggler_limit_s(0.1)
    rng = random.Random(11)
    book = LagBook(rules)
    history: dict[int, list[tuple[int, float, float]]] = {r: [] for r in range(6)}
    for step in range(60):
        standings = {}
        for r in range(6):
            c = rng.choice((0.0, 0.0, 0.02)) if r in (2, 4) else rng.choice((0.0, 0.0, 0.0, 0.02))
            link = rng.choice((0.0, 0.02)) if r in (3, 4) else 0.0
            standings[r] = Standing(c, link, None)
            history[r].append((step, c, link))
        book.add(step, standings, 0.1)
        got = {(f.rank, f.kind): f.first_step for f in book.findings()}
        assert got == _flags_by_definition(history, rules, limit), step


def test_a_run_with_a_straggler_and_a_memory_outlier_is_judged_as_by_its_summaries() -> None:
    """ClusterState on the fixture run, one rank's activations tripled: every rank's newest
    summary equals the fold of its newest report, the straggler is flagged and the memory
    outlier is the step's worst."""
    shape = RunShape(ranks=16, steps=12, straggle_from=2)
    state = ClusterState()
    for m in synthetic_run(shape):
        if isinstance(m, StepReport) and m.rank == 5:
            memory = msgspec.structs.replace(m.memory, activations=(m.memory.activations or 0) * 3)
            m = msgspec.structs.replace(m, memory=memory)
        state.ingest(m)
    for r, rs in state.ranks.items():
        assert rs.latest is not None and rs.summary is not None
        want = fold(rs.latest.collectives, rs.latest.collectives_unfinished)
        assert (rs.summary.busy_s, rs.summary.sequence) == (want.busy_s, want.sequence), r
        assert rs.summary.exposed_s == pytest.approx(sum(g[3] for g in want.groups.values())), r
    assert [(f.kind, f.rank) for f in state.findings()] == [("straggler", 15)]
    latest = state.latest()
    assert latest is not None and latest.worst_memory_rank == 5


def test_the_worst_memory_rank_and_the_median_memory_equal_their_definitions() -> None:
    """One pass makes both (StepAggregate.memory): equal to ``max`` over the ranks keyed by
    (P+G+O+A with NA as 0, lower rank first) and to statistics.median of the reported totals,
    on steps with ties, ranks that reported no memory at all, and reports out of rank order."""
    rng = random.Random(7)
    run = synthetic_run(RunShape(ranks=24, steps=2))
    hellos = [m for m in run if isinstance(m, Hello)]
    base = [m for m in run if isinstance(m, StepReport)]
    for trial in range(200):
        state = ClusterState()
        state.ingest_all(hellos)
        reports = [m for m in base if m.step == 1]
        rng.shuffle(reports)
        for m in reports:
            none = rng.random() < 0.2
            size = rng.choice([0, 1, 2, 3]) * 2**20  # few values: ties are common
            memory = msgspec.structs.replace(
                m.memory,
                params=None if none else size,
                grads=None if none else 0,
                optim=None if none else 0,
                activations=None if none else rng.choice([None, 0]),
            )
            state.ingest(msgspec.structs.replace(m, memory=memory))
        (agg,) = state.steps.values()
        assert agg.complete and len(agg.summaries) == 24
        totals = {r: s.device_total for r, s in agg.summaries.items()}
        worst = max(totals, key=lambda r: (totals[r] or 0, -r))
        known = [t for t in totals.values() if t is not None]
        assert agg.worst_memory_rank == worst, trial
        point = state.series.points[-1] if state.series.points else None
        median = statistics.median(known) if known else None
        assert point is not None and point.median_memory == median and point.memory_rank == worst
