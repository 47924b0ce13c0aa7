"""A rank that never reports is named, with the reason, in one network namespace:
synthetic Hellos and Admission records into ClusterState (the roster logic against hand-written
answers), then real senders refused or rejected by a real collector, its trace, ``summary
--json``, headless replay, and a node's own probe of its collector."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import zmq

from tests.fixtures import synthetic_run, write_trace
from zeroscope.agent import schema
from zeroscope.agent.collector_probe import CollectorProbe
from zeroscope.agent.publish import Publisher, set_credentials
from zeroscope.agent.schema import Admission, Hello, SenderClaim, StepReport
from zeroscope.cli import main as cli_main
from zeroscope.collector.server import Collector, wait_for
from zeroscope.remote.ssh import free_port
from zeroscope.state import AlertRules, ClusterState
from zeroscope.state.lines import summary_lines
from zeroscope.state.roster import headcount, node_of, rank_ranges
from zeroscope.store.trace import TraceReader
from zeroscope.tui.feed import ReplayFeed
from zeroscope.tui.header import header_segments

T0 = 1_700_000_000.0


def hello(rank: int, world: int, per_node: int = 0, node: int | None = None) -> Hello:
    return Hello(
        schema_version=schema.SCHEMA_VERSION,
        job_id="j",
        rank=rank,
        world_size=world,
        local_rank=rank % per_node if per_node else 0,
        node_rank=node if node is not None else (rank // per_node if per_node else 0),
        local_world_size=per_node,
    )


def refused(rank: int, node: int, peer: str, count: int = 1, world: int = 0) -> Admission:
    return Admission(
        wall_ns=int((T0 + 1) * 1e9),
        reason="unauthenticated",
        unit="connection",
        count=count,
        peer=peer,
        rank=rank,
        node_rank=node,
        world_size=world,
        role="rank",
    )


def test_rank_ranges_and_the_node_layout() -> None:
    assert rank_ranges([8, 9, 10, 11, 12, 13, 14, 15]) == "r8-15"
    assert rank_ranges([5, 1, 3, 4]) == "r1,r3-5"
    assert rank_ranges(range(0, 40, 2)) == "r0,r2,r4,r6,r8,r10 +14"
    # local_world_size says it; without it a rank on a node other than 0 gives it away.
    assert node_of([hello(r, 16, 8) for r in range(8)])(13) == 1
    other = Hello(schema_version=2, job_id="j", rank=9, world_size=16, local_rank=1, node_rank=1)
    assert node_of([other])(13) == 1  # (9 - 1) / 1 = 8 ranks per node
    assert node_of([hello(0, 16)])(13) is None  # one node-0 rank cannot tell


def test_missing_ranks_grouped_by_node_with_the_reason() -> None:
    state = ClusterState()
    for r in range(8):  # node 0 of a 24-rank job reports
        state.ingest(hello(r, 24, 8), T0)
    for r in range(8, 16):  # node 1 has the wrong token
        state.ingest(refused(r, 1, "10.0.0.2", count=2, world=24), T0 + 1)
    # node 2 was launched without zeroscope: nothing about it at all
    assert headcount(state) == (8, 24)
    assert ("ranks 8/24", "bold red") in header_segments(state)
    groups = state.missing()
    assert [(g.label, g.reason) for g in groups] == [
        ("r8-15 (node 1)", "unauthenticated"),
        ("r16-23 (node 2)", "unheard"),
    ]
    assert groups[0].explanation == (
        "its reports were refused: wrong ZEROSCOPE_TOKEN (16 connections from 10.0.0.2)"
    )
    assert "nothing heard from it" in groups[1].explanation
    # The alert waits for the grace period (nodes start within seconds of each other).
    rules = AlertRules()
    assert "missing" not in [a.kind for a in state.alerts(T0 + rules.missing_after_s - 1)]
    [alert] = [a for a in state.alerts(T0 + rules.missing_after_s + 1) if a.kind == "missing"]
    assert alert.ranks == tuple(range(8, 24))
    assert alert.message.startswith("16 of 24 ranks never reported: r8-15 (node 1): its reports")
    # The end-of-run lines say it without waiting.
    lines = summary_lines(state)
    assert "missing ranks: 16 of 24 never reported" in lines
    assert (
        "  missing r8-15 (node 1): its reports were refused: wrong ZEROSCOPE_TOKEN "
        "(16 connections from 10.0.0.2)"
    ) in lines
    # Once every rank reported, nothing is missing and the header says so plainly.
    for r in range(8, 24):
        state.ingest(hello(r, 24, 8), T0 + 2)
    assert state.missing() == [] and ("24 ranks", "") in header_segments(state)
    assert not any(line.startswith("missing") for line in summary_lines(state))


def test_the_most_telling_reason_wins() -> None:
    base = dict(wall_ns=int(T0 * 1e9), peer="10.0.0.3")
    records = [
        Admission(reason="admitted", unit="connection", rank=1, role="rank", **base),  # type: ignore[arg-type]
        Admission(reason="oversize", rank=1, role="rank", detail="too big", **base),  # type: ignore[arg-type]
        Admission(reason="admitted", unit="connection", node_rank=2, role="launcher", **base),  # type: ignore[arg-type]
        Admission(reason="handshake", unit="connection", count=3, **base),  # type: ignore[arg-type]
    ]
    state = ClusterState()
    state.ingest(hello(0, 4, 1), T0)
    for rec in records:
        state.ingest(rec, T0)
    by_rank = {r: g for g in state.missing() for r in g.ranks}
    assert by_rank[1].reason == "oversize" and "over the size limit" in by_rank[1].explanation
    # node 2's launcher got in, its rank sent nothing: the script does not report
    assert by_rank[2].reason == "admitted"
    assert by_rank[2].explanation.startswith("node 2's zeroscope reached the collector from")
    # rank 3: no word of its own; senders that named no rank failed the handshake
    assert by_rank[3].reason == "handshake" and "3 connections" in by_rank[3].explanation


def test_a_job_of_refused_ranks_only_still_counts_them() -> None:
    """No Hello at all: the world size comes from what the refused ranks claimed."""
    state = ClusterState()
    state.ingest(refused(0, 0, "10.0.0.1", world=2), T0)
    assert headcount(state) == (0, 2)
    assert [g.label for g in state.missing()] == ["r0 (node 0)", "r1"]


def _relay(col: Collector) -> ClusterState:
    state = ClusterState()
    col.add_listener(lambda m: state.ingest(m, time.time()))
    return state


def test_a_wrong_token_is_refused_named_recorded_summarized_and_replayed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.zstrace"
    col = Collector(token=b"right", record=trace)
    state = _relay(col)
    with col:
        claim0 = SenderClaim(rank=0, world_size=2, node_rank=0, hostname="n0")
        claim1 = SenderClaim(rank=1, world_size=2, node_rank=1, hostname="n1")
        good = Publisher(col.ingest_address, b"right", claim=claim0)
        bad = Publisher(col.ingest_address, b"wrong", claim=claim1)
        t0 = time.monotonic()
        assert not bad.wait_connected(10)  # refused: the wait ends at once, not at 10 s
        assert time.monotonic() - t0 < 5 and bad.refused.startswith("wrong token")
        good.set_sticky(hello(0, 2, 1))
        assert wait_for(lambda: (good.poll_connection(), not good.hello_pending)[1])
        for step in (1, 2):
            assert good.send(StepReport(rank=0, step=step, wall_ns=time.time_ns(), duration_s=0.1))
        assert not bad.send(StepReport(rank=1, step=1, wall_ns=0, duration_s=0.1))  # dropped
        assert wait_for(lambda: col.accepted == 3)
        good.close()
        bad.close()
    assert col.stats()["refused_connections"] == {"unauthenticated": 1}
    assert col.received == col.accepted  # nothing of the refused sender got in
    [group] = state.missing()
    assert (group.ranks, group.node, group.reason) == ((1,), 1, "unauthenticated")
    assert "1 connection from 127.0.0.1" in group.explanation
    with TraceReader(trace) as reader:
        [record] = reader.admissions()
        assert (record.rank, record.peer, record.hostname) == (1, "127.0.0.1", "n1")
    assert cli_main(["summary", "--json", str(trace)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["missing_ranks"] == [
        {"rank": 1, "node": 1, "reason": "unauthenticated", "message": group.explanation}
    ]
    assert cli_main(["summary", str(trace)]) == 0
    assert f"missing r1 (node 1): {group.explanation}" in capsys.readouterr().out
    assert cli_main(["replay", "--headless", str(trace)]) == 0
    replayed = capsys.readouterr().out.splitlines()
    assert f"  missing r1 (node 1): {group.explanation}" in replayed
    # The TUI's replay feed: a seek rebuilds the state with the refusal, as live.
    with TraceReader(trace) as reader:
        batch = ReplayFeed(reader).poll(0.01)
        assert batch is not None and batch.reset
        again = ClusterState()
        again.ingest_all(batch.messages)
    assert again.missing() == state.missing()
    assert ("ranks 1/2", "bold red") in header_segments(again)


def test_rejected_messages_are_attributed_to_the_claimed_rank() -> None:
    """Malformed and oversize messages on an admitted connection: the connection's claim (its
    handshake user name, kept by ZeroMQ as the frame's User-Id) names the rank."""
    col = Collector(token=b"t")
    state = _relay(col)
    with col:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        set_credentials(push, b"t", SenderClaim(rank=1, world_size=3, node_rank=0))
        push.connect(col.ingest_address)
        push.send_multipart([b"t", schema.encode(hello(0, 3))])
        push.send_multipart([b"t", b"\xc1garbage"])
        push.send_multipart([b"t", b"\x00" * (schema.MAX_MESSAGE_BYTES + 16)])
        forged = Admission(wall_ns=0, reason="admitted", rank=2)
        push.send_multipart([b"t", schema.encode(forged)])  # only the collector writes these
        assert wait_for(lambda: col.received == 4)
        push.close(0)
        ctx.term()
    assert col.rejected == {"malformed": 2, "oversize": 1}
    by_rank = {r: g for g in state.missing() for r in g.ranks}
    assert by_rank[1].reason == "oversize" and "from 127.0.0.1" in by_rank[1].explanation
    assert by_rank[2].reason == "unheard"  # a forged record names nobody


def test_a_sender_without_credentials_fails_the_handshake_and_is_counted() -> None:
    with Collector() as col:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)  # NULL mechanism: not zeroscope's handshake
        push.connect(col.ingest_address)
        assert wait_for(lambda: col.gate.refused.get("handshake", 0) >= 1)
        push.close(0)
        ctx.term()
    assert col.received == 0


def test_admission_records_survive_history_trimming() -> None:
    """A viewer joining after the history was trimmed still learns who was refused."""
    from zeroscope.store.sources import LiveSource

    col = Collector(token=b"t", history_bytes=2000)
    with col:
        bad = Publisher(col.ingest_address, b"x", claim=SenderClaim(rank=1, world_size=2))
        assert not bad.wait_connected(5) and bad.refused
        good = Publisher(col.ingest_address, b"t")
        good.set_sticky(hello(0, 2))
        assert wait_for(lambda: (good.poll_connection(), not good.hello_pending)[1])
        assert wait_for(lambda: col.seq >= 2)  # the Hello and the refusal record
        for step in range(1, 200):
            good.send(StepReport(rank=0, step=step, wall_ns=time.time_ns(), duration_s=0.1))
        assert wait_for(lambda: col.accepted == 200) and col._history_base > 2
        viewer = LiveSource(col.viewer_address, b"t")
        got: list = []
        assert wait_for(lambda: bool(got.extend(viewer.poll(0.1))) or len(got) >= 2, 10)
        viewer.close()
        good.close()
        bad.close()
    assert {type(m) for m in got[:2]} == {Hello, Admission}


def test_a_trace_without_admission_records_has_no_missing_ranks(tmp_path: Path) -> None:
    from zeroscope.commands.summary import summarize

    path = tmp_path / "old.zstrace"
    write_trace(path, synthetic_run())
    assert summarize(path)["missing_ranks"] == []


def test_a_nodes_probe_says_admitted_refused_or_unreachable() -> None:
    said: dict[str, list[str]] = {"ok": [], "bad": [], "none": []}
    col = Collector(token=b"right")
    records: list[Admission] = []
    col.add_listener(lambda m: records.append(m) if isinstance(m, Admission) else None)
    with col:
        probes = {
            "ok": CollectorProbe(col.ingest_address, "right", 1, say=said["ok"].append),
            "bad": CollectorProbe(col.ingest_address, "wrong", 2, say=said["bad"].append),
            "none": CollectorProbe(
                f"tcp://127.0.0.1:{free_port()}", "right", 3, say=said["none"].append,
                unreachable_s=1.0,
            ),
        }  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(p.state == "connecting" for p in probes.values()):
            for p in probes.values():
                p.poll(0.02)
        for p in probes.values():
            p.close()
        assert wait_for(lambda: col.seq >= 2)  # both launchers recorded
    assert {k: p.state for k, p in probes.items()} == {
        "ok": "reached",
        "bad": "refused",
        "none": "unreachable",
    }
    assert said["ok"] == [f"zeroscope: the collector at {col.ingest_address} admitted this node"]
    assert "refused this node: wrong token" in said["bad"][0]
    assert "cannot reach the collector" in said["none"][0]
    assert all("did not reach the collector" in said[k][-1] for k in ("bad", "none"))
    # node 0's side: whom it admitted, whom it refused (the unreachable one it never saw)
    assert {(r.role, r.node_rank, r.reason, r.peer) for r in records} == {
        ("launcher", 1, "admitted", "127.0.0.1"),
        ("launcher", 2, "unauthenticated", "127.0.0.1"),
    }
