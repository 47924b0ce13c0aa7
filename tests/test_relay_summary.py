"""Tier 1: the summary a node relay makes of each report (``StepReport.summary``,
agent/schema_summary.py, zeroscope/collector/relay_batch.py) is the viewer's own.

A viewer fed a run through a relay's batcher (its summaries taken as made) holds the same state
as one fed the same run directly (every summary made by the viewer): the run report, every
rank's history, every closed step's standings, the findings and the history series. The
summaries' fingerprints of the collective sequence are equal across processes (the relay and
the viewer are two), and a summary the viewer cannot trust (another version, another step) is
made again from the report."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from tests.fixtures import RunShape, split_by_step, synthetic_run
from tests.test_state_ingest_fold import _collectives
from zeroscope.agent import schema
from zeroscope.agent.schema import SUMMARY_VERSION, Message, StepReport
from zeroscope.collector.relay_batch import NodeBatcher
from zeroscope.state import ClusterState
from zeroscope.state.rank import summarize
from zeroscope.state.report import run_report

ROOT = Path(__file__).resolve().parent.parent


def relayed(run: list[Message]) -> list[Message]:
    """The run as a viewer of a relayed job gets it: each report through the relay's batcher,
    one batch per report, decoded from the batch's body."""
    batcher = NodeBatcher(0, "h")
    out: list[Message] = []
    for m in run:
        if isinstance(m, StepReport):
            batcher.add(m, schema.encode(m))
            (_, body), n = batcher.take()
            assert n == 1
            m = schema.decode(body)
            assert isinstance(m, StepReport) and m.summary is not None
        out.append(m)
    return out


def _odd_run(seed: int) -> list[Message]:
    """A fixture run whose reports carry odd collectives (untimed, unmeasured waits, 0 s,
    starts going backwards) and, now and then, unfinished ones or none."""
    rng = random.Random(seed)
    run = synthetic_run(RunShape(ranks=8, steps=12, straggle_from=4, seed=seed))
    out: list[Message] = []
    for m in run:
        if isinstance(m, StepReport):
            colls = _collectives(rng, rng.randrange(0, 24), odd=True)
            unfinished = 1 if rng.random() < 0.1 else 0
            m = msgspec.structs.replace(m, collectives=colls, collectives_unfinished=unfinished)
        out.append(m)
    return out


def _state(run: list[Message]) -> tuple[ClusterState, list[object]]:
    state = ClusterState()
    closed = []
    for m in run:
        closed += state.ingest(m)
    closed += state.flush()
    return state, [(a.step, a.standings, a.slowest_rank, a.exposed_s) for a in closed]


@pytest.mark.parametrize("odd", [False, True])
def test_a_relayed_viewer_holds_what_a_direct_one_does(odd: bool) -> None:
    run = _odd_run(3) if odd else synthetic_run(RunShape(ranks=16, steps=30, straggle_from=10))
    direct, direct_closed = _state(run)
    via, via_closed = _state(relayed(run))
    assert via_closed == direct_closed
    assert run_report(via) == run_report(direct)
    assert via.findings() == direct.findings()
    assert list(via.series.points) == list(direct.series.points)
    for r, rs in direct.ranks.items():
        assert list(via.ranks[r].history) == list(rs.history)
    # The relayed state really took the relay's summaries (no summary made again).
    for m in relayed(run):
        if isinstance(m, StepReport):
            held = [s for s in via.ranks[m.rank].history if s.step == m.step]
            assert held and held[0] == m.summary


def test_the_fingerprint_is_the_same_in_another_process() -> None:
    """A relay and a viewer are two processes: a salted ``hash`` would differ between them and
    every relayed rank would read as issuing another sequence than a direct one."""
    run = _odd_run(5)
    here = [summarize(m).sequence for m in run if isinstance(m, StepReport)]
    assert len(set(here)) > 3 and 0 in here  # sequences differ, and some are not comparable
    code = (
        "from tests.test_relay_summary import _odd_run\n"
        "from zeroscope.agent.schema import StepReport\n"
        "from zeroscope.state.rank import summarize\n"
        "print([summarize(m).sequence for m in _odd_run(5) if isinstance(m, StepReport)])\n"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == str(here)


@pytest.mark.parametrize("bad", ["version", "step"])
def test_a_summary_the_viewer_cannot_trust_is_made_again(bad: str) -> None:
    hellos, by_step = split_by_step(synthetic_run(RunShape(ranks=2, steps=3)))
    report = by_step[1][0]
    assert isinstance(report, StepReport)
    true = summarize(report)
    forged = msgspec.structs.replace(true, duration_s=99.0, comm_volume=1)
    if bad == "version":
        forged = msgspec.structs.replace(forged, version=SUMMARY_VERSION + 1)
    else:
        forged = msgspec.structs.replace(forged, step=report.step + 1)
    sent = schema.decode(schema.encode(msgspec.structs.replace(report, summary=forged)))
    state = ClusterState()
    state.ingest_all([*hellos, *by_step[0], sent])
    assert state.ranks[report.rank].summary == true


def test_a_decoded_summary_is_untracked_by_the_garbage_collector() -> None:
    """As the viewer's own (tests/test_state_gc_untracked.py): the summary, its ops dict and
    OpTotals, decoded from a relayed report, are never walked by a collection."""
    run = relayed(synthetic_run(RunShape(ranks=2, steps=2)))
    m = next(m for m in run if isinstance(m, StepReport) and m.step == 1)
    assert isinstance(m, StepReport) and m.summary is not None and m.summary.ops
    assert not gc.is_tracked(m.summary)
    assert not gc.is_tracked(m.summary.ops)
    assert not any(gc.is_tracked(t) for t in m.summary.ops.values())


def test_a_report_whose_summary_cannot_be_sent_goes_on_as_the_rank_sent_it() -> None:
    """An all-reduce of 2**63 bytes: its size fits msgpack, its volume (2S) does not. The relay
    sends that report as it came (the viewer folds it) and goes on summarizing the rest; nothing
    is lost and no thread dies."""
    _, by_step = split_by_step(synthetic_run(RunShape(ranks=2, steps=2)))
    plain = [m for m in by_step[1] if isinstance(m, StepReport)]
    big = schema.Collective("all_reduce", 2**63, 2, 0.0, 0.001, 0.0)
    odd = msgspec.structs.replace(plain[0], collectives=[big])
    batcher = NodeBatcher(0, "h")
    sent = [schema.encode(odd), schema.encode(plain[1])]
    batcher.add(odd, sent[0])
    batcher.add(plain[1], sent[1])
    (header, body), n = batcher.take()
    assert n == 2 and batcher.unsummarized == 1
    sizes = [e.size for e in schema.decode_batch(header).entries]
    assert body[: sizes[0]] == sent[0]  # as the rank sent it
    second = schema.decode(body[sizes[0] :])
    assert isinstance(second, StepReport) and second.summary == summarize(plain[1])
    state = ClusterState()
    assert state.ranks.get(odd.rank) is None
    state.ingest(schema.decode(body[: sizes[0]]))
    assert state.ranks[odd.rank].summary == summarize(odd)  # folded by the viewer
