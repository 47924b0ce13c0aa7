"""Tier 1: a node relay's batches (agent/node_batch.py, collector/relay_batch.py,
collector/batch_ingest.py).

The per-node aggregate a relay computes is checked against one recomputed here from the rank
reports by brute force; a relayed run's trace against a direct run's of the same synthetic
ranks (the agent's real Publisher over real sockets, a real Relay, two real collectors); a
viewer subscribed to a relayed collector against the reports sent; and the collector's refusal
of batches it cannot trust."""

from __future__ import annotations

import random
import time
from pathlib import Path

import msgspec
import pytest
import zmq

from zeroscope.agent import schema
from zeroscope.agent.publish import Publisher
from zeroscope.agent.schema import (
    Collective,
    Event,
    Hello,
    MemoryBytes,
    Message,
    NodeStep,
    SenderClaim,
    StepReport,
)
from zeroscope.collector import protocol as proto
from zeroscope.collector.relay import Relay
from zeroscope.collector.relay_batch import NodeBatcher
from zeroscope.collector.server import Collector, wait_for
from zeroscope.state import node_steps
from zeroscope.state.rank import summarize
from zeroscope.store.sources import LiveSource
from zeroscope.store.thinning import ThinningPolicy
from zeroscope.store.trace import TraceReader

TOKEN = b"relay-batch-token"
NODES, PER_NODE, STEPS = 2, 4, 9
WORLD = NODES * PER_NODE
WAIT_S = 30.0
POLICY = ThinningPolicy(every=4, recent=2, from_ranks=WORLD)


def synthetic_report(rank: int, step: int) -> StepReport:
    """Figures that differ by rank and step, with ties, unmeasured parts and an overflow."""
    rng = random.Random(rank * 1000 + step)
    collectives = [
        Collective(
            op="all_gather",
            nbytes=rng.randrange(1, 2**24),
            group_size=WORLD,
            start_s=0.01 * i,
            duration_s=0.002,
            exposed_s=rng.choice([0.0, 0.001, 0.003]),
        )
        for i in range(rng.randrange(0, 5))
    ]
    return StepReport(
        rank=rank,
        step=step,
        wall_ns=1_700_000_000_000_000_000 + step * 10**9 + rng.randrange(10**6),
        # Ties (the slowest is then the lowest rank) and one steady straggler, rank 5.
        duration_s=rng.choice([0.5, 0.5, 0.51, 0.52]) + (0.5 if rank == 5 else 0.0),
        memory=MemoryBytes(
            params=rng.randrange(2**30),
            grads=None if rank % 3 == 0 else rng.randrange(2**29),
            optim=rng.randrange(2**31),
        ),
        collectives=collectives,
        overflow=(rank, step) == (2, 6),
        samples=4,
    )


def hello(rank: int) -> Hello:
    return Hello(
        schema_version=schema.SCHEMA_VERSION,
        job_id="batch-job",
        rank=rank,
        world_size=WORLD,
        node_rank=rank // PER_NODE,
        local_rank=rank % PER_NODE,
        local_world_size=PER_NODE,
    )


def brute_force(reports: list[StepReport], node_of: dict[int, int]) -> dict[tuple, tuple]:
    """The per-(step, node) figures written out from the reports, one figure at a time."""
    out: dict[tuple, tuple] = {}
    keys = sorted({(r.step, node_of[r.rank]) for r in reports})
    for step, node in keys:
        mine = [r for r in reports if r.step == step and node_of[r.rank] == node]
        times = [r.duration_s for r in mine]
        slowest = min(r.rank for r in mine if r.duration_s == max(times))
        held = [
            sum(v or 0 for v in (r.memory.params, r.memory.grads, r.memory.optim)) for r in mine
        ]
        exposed = [sum(c.exposed_s for c in r.collectives) for r in mine]
        out[(step, node)] = (
            len(mine),
            min(times),
            pytest.approx(sum(times) / len(mine)),
            max(times),
            slowest,
            max(r.wall_ns for r in mine),
            max(held),
            min(held),
            pytest.approx(max(exposed)),
            sum(c.nbytes for r in mine for c in r.collectives),
            sum(r.samples for r in mine),
            any(r.overflow or r.skipped for r in mine),
        )
    return out


def figures_of(agg: NodeStep) -> tuple:
    return (
        agg.ranks,
        agg.step_s_min,
        agg.step_s_sum / agg.ranks,
        agg.step_s_max,
        agg.slowest_rank,
        agg.wall_ns_max,
        agg.memory_max,
        agg.memory_min,
        agg.exposed_s_max,
        agg.comm_bytes,
        agg.samples,
        agg.alerted,
    )


def summarized(report: StepReport) -> StepReport:
    """The report as a relay sends it on: every field as the rank sent it, and the summary the
    viewer makes of it (zeroscope.state.rank.summarize) inside."""
    return msgspec.structs.replace(report, summary=summarize(report))


def test_node_aggregate_equals_the_one_from_the_rank_reports() -> None:
    """Reports in a shuffled order, cut into batches at random points (a step's reports split
    over batches, as a relay's wake-ups split them): the merged aggregates equal the brute
    force over the reports, and the entries and body give back every report, with the summary
    the viewer would make of it."""
    rng = random.Random(7)
    reports = [synthetic_report(r, s) for s in range(1, STEPS + 1) for r in range(WORLD)]
    rng.shuffle(reports)
    batcher = NodeBatcher(node_rank=0, hostname="h")
    for r in range(WORLD):
        batcher.hello(hello(r))
    merged: dict[tuple[int, int], NodeStep] = {}
    back: list[bytes] = []
    batches = 0

    def take() -> None:
        nonlocal batches
        (header, body), n = batcher.take()
        batch = schema.decode_batch(header)
        assert len(batch.entries) == n
        at = 0
        for e in batch.entries:
            back.append(body[at : at + e.size])
            at += e.size
        assert at == len(body)
        for agg in batch.nodes:
            key = (agg.step, agg.node_rank)
            if key in merged:
                node_steps.merge(merged[key], agg)
            else:
                merged[key] = agg
        batches += 1

    for report in reports:
        batcher.add(report, schema.encode(report))
        if rng.random() < 0.15:
            take()
    take()
    assert batches > STEPS  # the split really happened
    assert back == [schema.encode(summarized(r)) for r in reports]
    decoded = [schema.decode(b) for b in back]
    assert [msgspec.structs.replace(m, summary=None) for m in decoded] == reports
    assert all(isinstance(m, StepReport) and m.summary is not None for m in decoded)
    expected = brute_force(reports, {r: r // PER_NODE for r in range(WORLD)})
    assert {k: figures_of(v) for k, v in merged.items()} == expected


def _send_job(pubs: list[Publisher], col: Collector) -> None:
    """Every rank's report of every step, a step at a time (each arrives before the next is
    sent, so both runs thin the same steps), and one Event."""
    for step in range(1, STEPS + 1):
        for rank, pub in enumerate(pubs):
            assert pub.send(synthetic_report(rank, step))
        if step == 3:
            pubs[1].send(Event(rank=1, step=3, wall_ns=1, event="info", message="three"))
        assert wait_for(lambda s=step: col.reports == s * WORLD, WAIT_S)


def _publishers(addresses: list[str]) -> list[Publisher]:
    pubs = []
    for rank in range(WORLD):
        claim = SenderClaim(rank=rank, world_size=WORLD, node_rank=rank // PER_NODE)
        pub = Publisher(addresses[rank // PER_NODE], TOKEN, claim=claim)
        pub.set_sticky(hello(rank))
        pubs.append(pub)
    assert wait_for(
        lambda: all((p.poll_connection(), not p.hello_pending)[1] for p in pubs), WAIT_S
    )
    return pubs


def _run(trace: Path, relayed: bool) -> Collector:
    col = Collector(token=TOKEN, record=trace, thinning=POLICY)
    with col:
        relays = [
            Relay(col.ingest_address, token=TOKEN, node_rank=n).start()
            for n in range(NODES if relayed else 0)
        ]
        pubs = _publishers([r.address for r in relays] if relayed else [col.ingest_address] * 2)
        try:
            _send_job(pubs, col)
            assert wait_for(lambda: col.accepted >= WORLD * (STEPS + 1) + 1, WAIT_S)
        finally:
            for pub in pubs:
                pub.close(0)
            for relay in relays:
                relay.stop()
    return col


def _with_summary(message: Message, payload: bytes) -> bytes:
    if not isinstance(message, StepReport):
        return payload
    return schema.encode(summarized(msgspec.structs.replace(message, summary=None)))


def _summaries(path: Path) -> set[str]:
    """How the trace's reports carry their summary: "none", "the viewer's" (equal to the one
    the viewer makes, field for field) or "other"."""
    with TraceReader(path) as reader:
        found = set()
        for _, p in reader.raw():
            m = schema.decode(p)
            if isinstance(m, StepReport):
                s = m.summary
                plain = msgspec.structs.replace(m, summary=None)
                found.add(
                    "none" if s is None else "the viewer's" if s == summarize(plain) else "other"
                )
        return found


def _contents(path: Path) -> tuple[object, ...]:
    """Hellos, every message's bytes by (step, rank, kind), node_steps rows (floats to 1e-9:
    a mean's sum may add in another order), and the thinning. A report's bytes are taken with
    the summary the viewer makes of it, so a direct run's (which has none) and a relayed run's
    (its relay's) compare."""
    with TraceReader(path) as reader:
        rows = sorted(
            (m.step, m.rank, type(m).__name__, _with_summary(m, p))
            for _, p in reader.raw()
            for m in [schema.decode(p)]
        )
        nodes = [
            tuple(round(v, 9) if isinstance(v, float) else v for v in row)
            for row in reader.node_steps()
        ]
        return reader.hellos(), rows, nodes, reader.thinning


def test_relayed_trace_equals_direct(tmp_path: Path) -> None:
    """The same synthetic ranks, directly and through one relay per node: the two traces hold
    the same Hellos, the same kept reports byte for byte but for the summary the relay put in
    each (the viewer's own, field for field), the same thinning and the same node_steps rows;
    the relayed collector took the reports in node batches."""
    direct = _run(tmp_path / "direct.zstrace", relayed=False)
    relayed = _run(tmp_path / "relayed.zstrace", relayed=True)
    assert direct.batches == 0 and relayed.batches > 0
    assert direct.rejected == relayed.rejected == {}
    assert direct.reports == relayed.reports == WORLD * STEPS
    d, r = _contents(tmp_path / "direct.zstrace"), _contents(tmp_path / "relayed.zstrace")
    assert d[3] is not None  # thinned: the comparison covers node_steps and deletions
    kept_steps = {row[0] for row in d[1] if row[2] == "StepReport"}
    assert kept_steps < set(range(1, STEPS + 1))  # some steps' reports were thinned away
    assert len(d[2]) == NODES * (STEPS - POLICY.recent)
    assert d == r
    assert _summaries(tmp_path / "direct.zstrace") == {"none"}
    assert _summaries(tmp_path / "relayed.zstrace") == {"the viewer's"}


def test_viewer_of_a_relayed_collector_gets_every_report() -> None:
    """A remote viewer (LiveSource: snapshot, then PUB updates) of a collector fed node batches
    decodes every report sent, once, each as its rank sent it with its relay's summary."""
    seen: list[Message] = []
    with Collector(token=TOKEN) as col:
        source = LiveSource(col.viewer_address, TOKEN)
        relays = [Relay(col.ingest_address, token=TOKEN, node_rank=n).start() for n in range(NODES)]
        pubs = _publishers([r.address for r in relays])
        try:
            assert wait_for(lambda: (seen.extend(source.poll(0.05)), source.caught_up)[1], WAIT_S)
            _send_job(pubs, col)
            want = {(r, s) for r in range(WORLD) for s in range(1, STEPS + 1)}

            def got() -> set[tuple[int, int]]:
                seen.extend(source.poll(0.05))
                return {(m.rank, m.step) for m in seen if isinstance(m, StepReport)}

            assert wait_for(lambda: got() == want, WAIT_S)
            reports = [m for m in seen if isinstance(m, StepReport)]
            assert len(reports) == len(want)
            assert all(m == summarized(synthetic_report(m.rank, m.step)) for m in reports)
            assert col.batches > 0
        finally:
            for pub in pubs:
                pub.close(0)
            for relay in relays:
                relay.stop()
            source.close()


def _batch(entries: list[schema.BatchEntry], body: bytes, version: int = 1) -> list[bytes]:
    header = schema.encode_batch(
        schema.NodeBatch(version=version, node_rank=0, hostname="h", entries=entries, nodes=[])
    )
    return [proto.NODE_BATCH, TOKEN, header, body]


@pytest.mark.parametrize("role", ["relay", "rank"])
def test_collector_refuses_a_batch_it_cannot_trust(role: str) -> None:
    """A batch from a sender that is not a relay, of another version, whose sizes do not add
    up to its body, or holding a message that is not a StepReport: counted as rejected with
    the reason, nothing accepted; a good one from a relay is accepted whole."""
    report = schema.encode(synthetic_report(0, 1))
    good = node_steps.entry(synthetic_report(0, 1), len(report), 0, 0.0)
    ctx = zmq.Context()
    with Collector(token=TOKEN) as col:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.plain_username = SenderClaim(role=role, node_rank=0).username()
        push.plain_password = TOKEN
        push.connect(col.ingest_address)
        try:
            push.send_multipart(_batch([good], report, version=99))
            push.send_multipart(_batch([good], report + b"x"))
            hello_bytes = schema.encode(hello(0))
            as_step = node_steps.entry(synthetic_report(0, 1), len(hello_bytes), 0, 0.0)
            push.send_multipart(_batch([as_step], hello_bytes))  # not a StepReport
            push.send_multipart(_batch([good], report))
            assert wait_for(lambda: col.received == 4, WAIT_S)
            time.sleep(0.2)
            if role == "relay":
                assert col.rejected == {"schema_version": 1, "malformed": 2}
                assert (col.accepted, col.reports, col.batches) == (1, 1, 1)
            else:
                assert col.rejected == {"schema_version": 1, "framing": 3}
                assert col.accepted == 0
            assert col.received == col.accepted + sum(col.rejected.values())
        finally:
            push.close(0)
            ctx.term()
