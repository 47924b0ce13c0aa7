"""Tier 1: node relays between the ranks and the collector (zeroscope/collector/relay.py).

The ranks are the agent's real Publisher over real ZeroMQ sockets; node 1's relay is the real
``zeroscope relay`` process, killed with SIGKILL mid-run; the collector's accepted messages feed
a real ClusterState, whose alerts are what a person watching the job sees."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from zeroscope.agent import schema
from zeroscope.agent.publish import Publisher
from zeroscope.agent.schema import Admission, Hello, Message, SenderClaim, StepReport
from zeroscope.collector.relay import Relay
from zeroscope.collector.server import Collector, wait_for
from zeroscope.state.cluster import ClusterState

TOKEN = b"relay-test-token"
PER_NODE = 4
WAIT_S = 30.0
"""Generous: a loaded 2-core machine; every wait ends as soon as its condition holds."""


def rank_publisher(address: str, rank: int, node: int, token: bytes = TOKEN) -> Publisher:
    claim = SenderClaim(rank=rank, world_size=2 * PER_NODE, node_rank=node)
    pub = Publisher(address, token, claim=claim)
    pub.set_sticky(
        Hello(
            schema_version=schema.SCHEMA_VERSION,
            job_id="job",
            rank=rank,
            world_size=2 * PER_NODE,
            node_rank=node,
            local_rank=rank % PER_NODE,
            local_world_size=PER_NODE,
        )
    )
    return pub


def report(rank: int, step: int) -> StepReport:
    return StepReport(rank=rank, step=step, wall_ns=time.time_ns(), duration_s=0.01)


def connect_all(pubs: list[Publisher]) -> None:
    """As the agent's sampler thread does: poll until every Hello went out."""
    assert wait_for(
        lambda: all((p.poll_connection(), not p.hello_pending)[1] for p in pubs), WAIT_S
    )


def steps_of(seen: list[Message]) -> set[tuple[int, int]]:
    return {(m.rank, m.step) for m in seen if isinstance(m, StepReport)}


@contextlib.contextmanager
def relay_process(collector: str, port: int = 0) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``zeroscope relay`` for node 1; yields (process, the address its ranks use)."""
    env = {**os.environ, "ZEROSCOPE_TOKEN": TOKEN.decode()}
    cmd = [sys.executable, "-m", "zeroscope", "relay", "--collector", collector]
    cmd += ["--port", str(port), "--node-rank", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("export ZEROSCOPE_COLLECTOR=tcp://"), line
        yield proc, line.split("=", 1)[1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(WAIT_S)


def test_relay_door_refuses_as_the_collector_does() -> None:
    """A wrong token: refused at the relay's handshake, and the collector receives the same
    record (reason, unit, detail, claimed rank) its own door writes for a direct sender."""
    seen: list[Message] = []
    with (
        Collector(token=TOKEN) as col,
        Relay(col.ingest_address, token=TOKEN, node_rank=1) as relay,
    ):
        col.add_listener(seen.append)
        via_relay = rank_publisher(relay.address, 5, 1, token=b"wrong")
        direct = rank_publisher(col.ingest_address, 6, 1, token=b"wrong")
        try:
            for pub in (via_relay, direct):
                assert wait_for(lambda p=pub: (p.poll_connection(), p.refused)[1] != "", WAIT_S)
            assert via_relay.refused == direct.refused
            assert relay.gate.refused == col.gate.refused == {"unauthenticated": 1}

            def records() -> dict[int, Admission]:
                return {m.rank: m for m in seen if isinstance(m, Admission)}

            assert wait_for(lambda: {5, 6} <= records().keys(), WAIT_S)
            a, b = records()[5], records()[6]
            assert (a.reason, a.unit, a.detail, a.node_rank) == (
                b.reason,
                b.unit,
                b.detail,
                b.node_rank,
            )
            assert a.reason == "unauthenticated"
        finally:
            via_relay.close(0)
            direct.close(0)


def test_killed_relay_names_its_node_and_recovers() -> None:
    """Ranks 0-3 through an in-process relay (node 0), ranks 4-7 through a ``zeroscope relay``
    process (node 1). Every report arrives; SIGKILL node 1's relay and the collector names
    exactly ranks 4-7 with "relay on node 1 unreachable"; restart it on the same port and the
    ranks' reports flow again and the alert clears."""
    seen: list[Message] = []
    state = ClusterState()

    def listen(message: Message) -> None:
        seen.append(message)
        state.ingest(message, time.monotonic())

    col = Collector(token=TOKEN)
    col.add_listener(listen)
    with col, Relay(col.ingest_address, token=TOKEN, node_rank=0) as relay0:
        with relay_process(col.ingest_address) as (proc, address1):
            pubs = [rank_publisher(relay0.address, r, 0) for r in range(PER_NODE)]
            pubs += [rank_publisher(address1, r, 1) for r in range(PER_NODE, 2 * PER_NODE)]
            connect_all(pubs)
            for step in range(1, 21):
                for rank, pub in enumerate(pubs):
                    assert pub.send(report(rank, step))
            sent = {(r, s) for r in range(2 * PER_NODE) for s in range(1, 21)}
            assert wait_for(lambda: steps_of(seen) >= sent, WAIT_S)
            assert sum(isinstance(m, StepReport) for m in seen) == len(sent)  # none twice
            assert col.rejected == {} and col.dropped_by_agents == 0
            assert len(col.relays) == 2

            proc.send_signal(signal.SIGKILL)
            proc.wait(WAIT_S)

            def relay_alert() -> list[str]:
                return [a.message for a in state.alerts(time.monotonic()) if a.kind == "relay"]

            assert wait_for(lambda: relay_alert() != [], WAIT_S)
            (alert,) = [a for a in state.alerts(time.monotonic()) if a.kind == "relay"]
            assert alert.ranks == (4, 5, 6, 7)
            assert "relay on node 1 unreachable" in alert.message
        port = int(address1.rsplit(":", 1)[1])
        with relay_process(col.ingest_address, port) as (_proc, again):
            assert again == address1
            # The ranks' own senders reconnect by themselves and say Hello again.
            connect_all(pubs[PER_NODE:])
            step = 21

            def back() -> bool:
                nonlocal step
                for rank in range(PER_NODE, 2 * PER_NODE):
                    pubs[rank].send(report(rank, step))
                step += 1
                return all((r, 21) in steps_of(seen) for r in range(PER_NODE, 2 * PER_NODE))

            assert wait_for(back, WAIT_S, interval=0.2)
            assert wait_for(lambda: relay_alert() == [], WAIT_S)
            ups = [m for m in seen if isinstance(m, Admission) and m.reason == "relay_up"]
            assert [(m.node_rank, m.role) for m in ups] == [(1, "relay")]
        for pub in pubs:
            pub.close(0)


def test_relay_keeps_forwarding_through_a_collector_restart() -> None:
    """The collector stops; reports sent meanwhile wait in the relay; a new collector on the
    same port receives them and every rank's Hello (re-sent by the relay)."""
    first = Collector(token=TOKEN).start()
    port = int(first.ingest_address.rsplit(":", 1)[1])
    seen: list[Message] = []
    with Relay(first.ingest_address, token=TOKEN, node_rank=0) as relay:
        pubs = [rank_publisher(relay.address, r, 0) for r in range(PER_NODE)]
        try:
            connect_all(pubs)
            for rank, pub in enumerate(pubs):
                assert pub.send(report(rank, 1))
            assert wait_for(lambda: first.accepted == 2 * PER_NODE, WAIT_S)
            first.stop()
            for rank, pub in enumerate(pubs):
                assert pub.send(report(rank, 2))  # the relay takes them: its ranks see no gap
            second = Collector(token=TOKEN, port=port)
            second.add_listener(seen.append)
            with second:
                assert wait_for(lambda: steps_of(seen) >= {(r, 2) for r in range(PER_NODE)}, WAIT_S)
                hellos = {m.rank for m in seen if isinstance(m, Hello)}
                assert wait_for(
                    lambda: {m.rank for m in seen if isinstance(m, Hello)} == set(range(PER_NODE)),
                    WAIT_S,
                ), hellos
                assert relay.connections >= 2 and relay.hellos_resent == PER_NODE
                assert sum(p.dropped for p in pubs) == 0
        finally:
            for pub in pubs:
                pub.close(0)


def test_sums_a_node_batch_cannot_carry_go_plain_and_the_relay_goes_on() -> None:
    """Two ranks of one node each report two collectives of 2**63 bytes: each size fits
    msgpack, the summed bytes do not (a faulty sender's report, whatever the batching). Before,
    encoding the batch raised in the uplink's thread, which ended it: the node's later reports
    were never forwarded. Now those reports go as plain messages and every later one still
    reaches the collector."""
    seen: list[Message] = []
    big = schema.Collective("all_gather", 2**63, 2, 0.0, 0.001, 0.0)
    with Collector(token=TOKEN) as collector:
        collector.add_listener(seen.append)
        with Relay(collector.ingest_address, token=TOKEN, node_rank=0) as relay:
            pubs = [rank_publisher(relay.address, r, 0) for r in range(2)]
            try:
                connect_all(pubs)
                for rank, pub in enumerate(pubs):
                    odd = report(rank, 1)
                    odd.collectives = [big, big]
                    assert pub.send(odd)
                assert wait_for(lambda: steps_of(seen) >= {(0, 1), (1, 1)}, WAIT_S)
                assert relay.unbatched >= 1
                for rank, pub in enumerate(pubs):
                    assert pub.send(report(rank, 2))
                assert wait_for(lambda: steps_of(seen) >= {(0, 2), (1, 2)}, WAIT_S)
                got = [m for m in seen if isinstance(m, StepReport) and m.step == 1]
                assert [[c.nbytes for c in m.collectives] for m in got] == [[2**63] * 2] * 2
                # Step 2's went batched again (counted by the uplink's thread once sent).
                assert wait_for(lambda: relay.node_batches >= 1, WAIT_S)
            finally:
                for pub in pubs:
                    pub.close(0)


def test_relayed_ingest_bench_loses_nothing_and_batches() -> None:
    """bench/relay_ingest.py at a small size: both paths deliver every report the agents'
    senders sent (counted at the collector), and the relays' batches reach the collector
    (its rejections stay at zero: the merged framing is the agent's)."""
    from bench import relay_ingest

    args = relay_ingest.parser().parse_args(
        ["--sizes", "256", "--steps", "2", "--interval", "0.2", "--procs", "1"]
    )
    rows = relay_ingest.run(args)
    assert [r["path"] for r in rows] == ["direct", "relayed"]
    for r in rows:
        assert r["sent"] == 256 * 2 and r["received"] == r["sent"] and r["lost"] == 0, r
        assert r["rejected"] == 0, r


def test_relay_book_says_only_transitions() -> None:
    """A healthy relay writes nothing; silence past RELAY_SILENT_S is one relay_down record;
    its next beat is one relay_up record; a second silence counts a second outage."""
    from zeroscope.collector.relays import RELAY_SILENT_S, RelayBook

    book = RelayBook()
    claim = SenderClaim(role="relay", node_rank=7, hostname="gpu-7")
    assert book.beat(claim, "10.0.0.7", now_s=0.0) is None
    assert book.beat(claim, "10.0.0.7", now_s=0.5) is None
    assert book.due(now_s=0.5 + RELAY_SILENT_S) == []  # not past the limit yet
    (down,) = book.due(now_s=0.6 + RELAY_SILENT_S)
    assert (down.reason, down.role, down.node_rank, down.peer, down.count) == (
        "relay_down",
        "relay",
        7,
        "10.0.0.7",
        1,
    )
    assert down.detail.startswith("relay on node 7 unreachable")
    assert book.due(now_s=100.0) == []  # said once
    up = book.beat(claim, "10.0.0.7", now_s=101.0)
    assert up is not None and up.reason == "relay_up"
    assert [r.count for r in book.due(now_s=102.0 + RELAY_SILENT_S)] == [2]


def test_relay_command_refuses_what_the_collector_refuses(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No collector address, or a network-facing bind without the job token: one-line errors,
    exit 2, nothing bound."""
    from zeroscope.cli import main

    monkeypatch.delenv("ZEROSCOPE_TOKEN", raising=False)
    monkeypatch.delenv("ZEROSCOPE_COLLECTOR", raising=False)
    assert main(["relay"]) == 2
    assert "--collector tcp://HOST:PORT is required" in capsys.readouterr().err
    assert main(["relay", "--collector", "tcp://127.0.0.1:9", "--bind", "0.0.0.0"]) == 2
    assert "without a token" in capsys.readouterr().err
