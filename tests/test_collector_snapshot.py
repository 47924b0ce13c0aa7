"""A late viewer of a big job gets the state, not the history (zeroscope/collector/snapshot.py):
its catch-up's size depends on the ranks, not on how long the job has run, and the cluster
view it builds from it is the live one's."""

from __future__ import annotations

import time

import zmq

from zeroscope.agent import schema
from zeroscope.agent.publish import set_credentials
from zeroscope.agent.schema import Event, Hello, Message, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.collector.snapshot import SNAPSHOT_STEPS
from zeroscope.state import ClusterState
from zeroscope.store.sources import LiveSource

RANKS = 16


def run_job(col: Collector, steps: int, *, event_at: int | None = None, ranks: int = RANKS) -> int:
    """Hellos and ``steps`` steps of every rank into ``col``'s ingest socket; returns how many
    messages were sent."""
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 1000)
    set_credentials(push)
    push.connect(col.ingest_address)
    sent: list[Message] = [
        Hello(schema_version=schema.SCHEMA_VERSION, job_id="j", rank=r, world_size=ranks)
        for r in range(ranks)
    ]
    for step in range(1, steps + 1):
        sent += [
            StepReport(rank=r, step=step, wall_ns=10**9 * step, duration_s=0.5 + r / 10**5)
            for r in range(ranks)
        ]
        if step == event_at:
            sent.append(Event(rank=2, step=step, wall_ns=10**9 * step, event="overflow"))
    for i in range(0, len(sent), 64):
        push.send_multipart([b"", *(schema.encode(m) for m in sent[i : i + 64])])
    push.close()
    assert wait_for(lambda: col.accepted == len(sent), timeout=30)
    return len(sent)


def catch_up(col: Collector) -> tuple[list[Message], LiveSource]:
    """A viewer's whole catch-up (every message it gets until it is at the collector's seq)."""
    src = LiveSource(col.viewer_address)
    got: list[Message] = []
    deadline = time.monotonic() + 30
    while not (src.caught_up and src.last_seq >= col.seq) and time.monotonic() < deadline:
        got += src.poll(0.2)
    return got, src


def test_a_late_viewers_snapshot_does_not_grow_with_the_run() -> None:
    sizes = {}
    for steps in (30, 300):
        with Collector(snapshot_bytes=20_000) as col:
            run_job(col, steps, event_at=7)
            got, src = catch_up(col)
            src.close()
        assert src.snapshots >= 1
        # Every Hello, each rank's last SNAPSHOT_STEPS reports, the one Event.
        assert len(got) == RANKS + RANKS * SNAPSHOT_STEPS + 1
        reports = [m for m in got if isinstance(m, StepReport)]
        assert {m.step for m in reports} == set(range(steps - SNAPSHOT_STEPS + 1, steps + 1))
        assert [type(m) for m in got[:RANKS]] == [Hello] * RANKS  # in arrival order
        sizes[steps] = sum(len(schema.encode(m)) for m in got)
        state = ClusterState()
        state.ingest_all(got)
        state.flush()
        latest = state.complete_steps()[-1]
        assert latest.step == steps and len(latest.summaries) == RANKS
        assert [e.step for e in state.events] == [7]
    assert sizes[300] < sizes[30] * 1.05  # step numbers take a byte or two more


def test_a_small_history_is_still_sent_whole() -> None:
    with Collector() as col:
        sent = run_job(col, 30)
        got, src = catch_up(col)
        src.close()
    assert src.snapshots == 0
    assert len(got) == sent


def test_the_viewer_goes_on_live_after_the_snapshot() -> None:
    with Collector(snapshot_bytes=20_000) as col:
        run_job(col, 40)
        _, src = catch_up(col)
        try:
            ctx = zmq.Context.instance()
            push = ctx.socket(zmq.PUSH)
            push.setsockopt(zmq.LINGER, 1000)
            set_credentials(push)
            push.connect(col.ingest_address)
            late = StepReport(rank=0, step=41, wall_ns=41 * 10**9, duration_s=0.5)
            push.send_multipart([b"", schema.encode(late)])
            push.close()
            more: list[Message] = []
            deadline = time.monotonic() + 20
            while not more and time.monotonic() < deadline:
                more += src.poll(0.2)
        finally:
            src.close()
    assert more == [late]


def test_a_snapshot_in_many_frames_arrives_whole() -> None:
    """1,200 ranks: the state is 3,600 messages, more than one frame holds (2,000)."""
    ranks = 1200
    with Collector(snapshot_bytes=20_000) as col:
        run_job(col, 5, ranks=ranks)
        got, src = catch_up(col)
        src.close()
    assert src.snapshots == 2
    assert len(got) == ranks * (1 + SNAPSHOT_STEPS)
    state = ClusterState()
    state.ingest_all(got)
    state.flush()
    assert len(state.complete_steps()[-1].summaries) == ranks


def test_a_snapshot_taken_mid_step_carries_no_step_that_only_some_ranks_reach() -> None:
    """Half the ranks have reported step 31: the others' step-29 reports (still in their
    rings) would make the viewer close a step 29 of half the job; they are left out, and the
    view's newest closed step is 30, of every rank."""
    with Collector(snapshot_bytes=20_000) as col:
        run_job(col, 30)
        ahead = [
            StepReport(rank=r, step=31, wall_ns=31 * 10**9, duration_s=0.5)
            for r in range(RANKS // 2)
        ]
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 1000)
        set_credentials(push)
        push.connect(col.ingest_address)
        push.send_multipart([b"", *(schema.encode(m) for m in ahead)])
        push.close()
        assert wait_for(lambda: col.accepted == RANKS * 31 + RANKS // 2, timeout=30)
        got, src = catch_up(col)
        src.close()
    reports = [m for m in got if isinstance(m, StepReport)]
    by_step: dict[int, set[int]] = {}
    for m in reports:
        by_step.setdefault(m.step, set()).add(m.rank)
    assert by_step == {30: set(range(RANKS)), 31: set(range(RANKS // 2))}
    state = ClusterState()
    state.ingest_all(got)
    assert [a.step for a in state.complete_steps()] == [30]
    assert len(state.complete_steps()[0].summaries) == RANKS
    assert state.steps[31].complete is False


def test_a_rank_that_stopped_long_ago_still_has_its_newest_report_sent() -> None:
    from zeroscope.collector.snapshot import Snapshot

    snap = Snapshot()
    seq = 0
    for step in range(1, 11):
        for rank in range(3):
            if rank == 2 and step > 4:
                continue  # rank 2 stopped after step 4
            seq += 1
            report = StepReport(rank=rank, step=step, wall_ns=step, duration_s=0.5)
            snap.note(seq, report, schema.encode(report))
    sent = [schema.decode(payload) for _, payload in snap.items(0, [])]
    steps = sorted((m.rank, m.step) for m in sent if isinstance(m, StepReport))
    assert steps == [(0, 9), (0, 10), (1, 9), (1, 10), (2, 4)]
