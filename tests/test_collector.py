"""Tier 1: collector ingest, authentication, counters, recording, and viewers (snapshot + live),
driven by the agent's real Publisher over real ZeroMQ sockets."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zeroscope.agent import schema
from zeroscope.agent.publish import EARLY_HOLD, MAX_BATCH, Publisher, set_credentials
from zeroscope.agent.schema import Hello, Message, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.store.sources import LiveSource
from zeroscope.store.trace import TraceReader


def hello(rank: int = 0) -> Hello:
    return Hello(schema_version=schema.SCHEMA_VERSION, job_id="job", rank=rank, world_size=2)


def report(step: int, rank: int = 0) -> StepReport:
    return StepReport(rank=rank, step=step, wall_ns=0, duration_s=0.01)


def send_until(pub: Publisher, message: Message, timeout: float = 10.0) -> None:
    """Sends before the TCP handshake is done are dropped (IMMEDIATE): wait until the sticky
    Hello got through, as the agent's sampler thread does, then send."""
    assert wait_for(lambda: (pub.poll_connection(), not pub.hello_pending)[1], timeout)
    assert pub.send(message)


@contextlib.contextmanager
def connected() -> Iterator[tuple[Collector, Publisher, list[Message]]]:
    """A running collector, a publisher whose Hello and report 0 got through, and the list of
    what the collector accepted."""
    seen: list[Message] = []
    col = Collector()
    col.add_listener(seen.append)
    with col:
        pub = Publisher(col.ingest_address)
        pub.set_sticky(hello(0))
        send_until(pub, report(0))
        yield col, pub, seen
        pub.close()


def collect(source: LiveSource, n: int, timeout: float = 10.0) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += source.poll(0.1)
    return out


def test_non_loopback_bind_needs_a_token() -> None:
    with pytest.raises(ValueError, match="without a token"):
        Collector(bind_host="0.0.0.0")
    Collector(bind_host="0.0.0.0", token=b"secret")  # accepted (not started)
    Collector(bind_host="::1")


def test_ingest_records_and_serves_in_order(tmp_path: Path) -> None:
    seen: list[Message] = []
    col = Collector(record=tmp_path / "t.zst")
    col.add_listener(seen.append)
    with col:
        assert col.ingest_address.startswith("tcp://127.0.0.1:")
        pub = Publisher(col.ingest_address)
        pub.set_sticky(hello(0))
        send_until(pub, report(1))
        for step in range(2, 11):
            assert pub.send(report(step))
        early = LiveSource(col.viewer_address)  # joins mid-run: snapshot, then live
        first = collect(early, 11)
        assert pub.send_batch([report(step) for step in range(11, 21)]) == 10  # one message
        rest = collect(early, 10)
        late = LiveSource(col.viewer_address)  # joins after: the snapshot has it all
        everything = collect(late, 21)
        pub.close()
        early.close()
        late.close()
        assert wait_for(lambda: col.accepted == 21)
    expected = [hello(0)] + [report(s) for s in range(1, 21)]
    assert first + rest == expected
    assert everything == expected
    assert seen == expected
    assert col.received == col.accepted == 21 and col.rejected == {}
    with TraceReader(tmp_path / "t.zst") as r:
        assert r.hellos() == [hello(0)]
        assert list(r.messages()) == expected[1:]
        assert r.job_id == "job"


def test_a_batch_goes_as_few_messages_in_order_and_carries_the_drops_once() -> None:
    """The agent's sender hands a wake-up's reports over as one batch: they arrive in order
    (more than MAX_BATCH are split), each checked on its own, and the drops counted before the
    batch ride on its first report only (so the collector counts them once)."""
    with connected() as (col, pub, seen):
        pub.count_dropped(3)
        batch: list[Message] = [schema.Event(rank=0, step=1, wall_ns=0, event="overflow")]
        batch += [report(step) for step in range(1, MAX_BATCH + 10)]
        assert pub.send_batch(batch) == len(batch)
        assert wait_for(lambda: col.accepted == 2 + len(batch))
    assert seen[2:] == batch
    assert [r.dropped for r in seen[2:] if isinstance(r, StepReport)][:2] == [3, 0]
    assert col.dropped_by_agents == 3 and col.rejected == {}


def test_a_message_that_cannot_be_encoded_is_dropped_alone_and_counted() -> None:
    with connected() as (col, pub, seen):
        bad = report(1)
        bad.lr = object()  # type: ignore[assignment]  # msgspec cannot encode it
        assert pub.send_batch([bad, report(2), report(3)]) == 2
        assert wait_for(lambda: col.accepted == 4)
    assert [m.step for m in seen[2:] if isinstance(m, StepReport)] == [2, 3]
    assert (pub.errors, pub.dropped, col.dropped_by_agents) == (1, 1, 1)  # said by step 2


def test_bad_frames_and_tokens_are_counted_not_fatal() -> None:
    with Collector(token=b"right") as col:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        set_credentials(push, b"right")  # the connection gets in; each frame is checked too
        push.connect(col.ingest_address)
        good = schema.encode(report(1))
        push.send_multipart([b"right", good])
        push.send_multipart([b"wrong", good])
        push.send_multipart([b"", good])
        push.send_multipart([b"right", b"\xc1garbage"])
        push.send_multipart([b"right"])
        push.send_multipart(
            [b"right", schema.encode(Hello(schema_version=99, job_id="", rank=0, world_size=1))]
        )
        push.send_multipart([b"right", good])
        # A batch: each message in it is judged on its own; a wrong token rejects them all.
        push.send_multipart([b"right", good, b"\xc1garbage", good])
        push.send_multipart([b"wrong", good, good])
        assert wait_for(lambda: col.received == 12)
        push.close(0)
        ctx.term()
    assert col.accepted == 4
    assert col.unauthenticated == 4
    assert col.rejected == {
        "unauthenticated": 4,
        "malformed": 2,
        "framing": 1,
        "schema_version": 1,
    }
    assert col.received == col.accepted + sum(col.rejected.values())


def test_publisher_survives_a_collector_restart_on_the_same_port() -> None:
    col = Collector().start()
    port = int(col.ingest_address.rsplit(":", 1)[1])
    pub = Publisher(col.ingest_address)
    pub.set_sticky(hello(0))
    send_until(pub, report(1))
    col.stop()
    # Collector gone: sends fail fast (never block) and are counted.
    t0 = time.perf_counter()
    for s in range(2, 50):
        pub.send(report(s))  # queued to a dead connection or dropped: either way, at once
    assert time.perf_counter() - t0 < 5  # a blocking send would hang: far above 48 sends
    assert wait_for(lambda: not pub.send(report(50)), 5)  # the disconnect has been noticed
    col2 = Collector(port=port)
    got: list[Message] = []
    col2.add_listener(got.append)
    with col2:
        assert wait_for(lambda: (pub.poll_connection(), pub.send(report(51)))[1], 10)
        assert wait_for(lambda: len(got) >= 2)
    pub.close()
    # The new collector first hears who the rank is, then the report carrying the drop count.
    assert got[0] == hello(0)
    assert isinstance(got[1], StepReport) and got[1].step == 51
    assert got[1].dropped == pub.dropped >= 1
    assert col2.dropped_by_agents == pub.dropped


def test_the_last_reports_wait_for_a_restarted_collectors_connection() -> None:
    """A collector killed and restarted while the rank was held (SIGSTOP in the demo's fault
    test): the rank's connection state still says "connected" (the events of the loss and
    the redial not read, or not made yet), so the end of its run, which waited only for a
    rank it knew had lost its collector, sent its last reports and Bye into no connection
    (the restarted collector got nothing from that rank). ``wait_live`` waits until a message
    can go: with ZeroMQ's IMMEDIATE, until the socket is writable."""
    col = Collector().start()
    port = int(col.ingest_address.rsplit(":", 1)[1])
    pub = Publisher(col.ingest_address)
    pub.set_sticky(hello(0))
    send_until(pub, report(1))
    pub.poll_connection()
    assert pub.connected
    col.stop()  # no event read from here on: what the rank knows is stale
    col2 = Collector(port=port)
    got: list[Message] = []
    col2.add_listener(got.append)
    with col2:
        assert pub.wait_live(10)
        assert pub.send(report(2))
        assert wait_for(lambda: len(got) >= 2)
    pub.close()
    assert got[0] == hello(0)
    assert isinstance(got[1], StepReport) and got[1].step == 2


@pytest.mark.parametrize("extra", [0, 3])
def test_reports_sent_before_the_collector_answers_arrive_after_the_hello(extra: int) -> None:
    """Start-up: the collector is not there yet. The first EARLY_HOLD messages are held and
    arrive, in order after the Hello, once it answers; past that they are dropped and counted
    (the next report says how many); after the first connection nothing is held again."""
    from tests.distributed import free_port

    port = free_port()
    pub = Publisher(f"tcp://127.0.0.1:{port}")
    pub.set_sticky(hello(0))
    steps = range(1, EARLY_HOLD + extra + 1)
    taken = [pub.send(report(s)) for s in steps]
    assert taken == [True] * EARLY_HOLD + [False] * extra  # no collector: held, then dropped
    assert (pub.sent, pub.dropped) == (0, extra)
    got: list[Message] = []
    col = Collector(port=port)
    col.add_listener(got.append)
    with col:
        assert wait_for(lambda: (pub.poll_connection(), len(got) > EARLY_HOLD)[1], 10)
        assert pub.send(report(10_000))
        assert wait_for(lambda: len(got) == EARLY_HOLD + 2)
    assert got[0] == hello(0)
    assert [m.step for m in got[1:]] == [*range(1, EARLY_HOLD + 1), 10_000]  # type: ignore[union-attr]
    assert [m.dropped for m in got[1:] if m.dropped] == ([extra] if extra else [])  # type: ignore[union-attr]
    # Connected once: a collector gone again means drops, not holding.
    assert wait_for(lambda: (pub.poll_connection(), not pub.send(report(10_001)))[1], 5)
    pub.close()


def test_a_closed_publisher_holds_nothing() -> None:
    from tests.distributed import free_port

    pub = Publisher(f"tcp://127.0.0.1:{free_port()}")  # never connected
    assert pub.send(report(1))  # held for a collector that may still come
    pub.close()
    assert not pub.send(report(2))  # closed: dropped and counted, as before
    assert pub.dropped >= 1


def test_close_waits_for_a_monitor_poll_on_another_thread() -> None:
    """The sampler thread polls the connection monitor while the training thread closes the
    publisher (its join of the sampler timed out on a loaded machine): ZeroMQ sockets are not
    thread-safe, and the monitor closed under a poll can leave ``Context.term()`` waiting
    forever. Close waits for the poll in progress; a poll after close touches nothing (before
    the fix, polling the closed monitor raised inside and was counted in ``errors``)."""
    import threading

    from tests.distributed import free_port

    pub = Publisher(f"tcp://127.0.0.1:{free_port()}")  # never connected: each poll waits
    polling, stop = threading.Event(), threading.Event()

    def sampler() -> None:
        while not stop.is_set():
            polling.set()
            pub.poll_connection(0.2)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    assert polling.wait(30)
    closer = threading.Thread(target=pub.close, daemon=True)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "close() never returned: Context.term() waiting on a socket"
    time.sleep(0.3)  # the sampler polls again after the close
    stop.set()
    thread.join(60)
    assert not thread.is_alive()
    assert pub.closed
    assert pub.errors == 0


def test_live_source_follows_a_restarted_collector() -> None:
    col = Collector().start()
    port = int(col.ingest_address.rsplit(":", 1)[1])
    vport = int(col.viewer_address.rsplit(":", 1)[1])
    pub = Publisher(col.ingest_address)
    pub.set_sticky(hello(0))
    send_until(pub, report(1))
    src = LiveSource(col.viewer_address)
    assert collect(src, 2) == [hello(0), report(1)]
    col.stop()
    with Collector(port=port, viewer_port=vport):
        assert wait_for(lambda: (pub.poll_connection(), pub.send(report(2)))[1], 10)
        got = collect(src, 2)
    pub.close()
    src.close()
    assert src.restarts == 1
    assert got[0] == hello(0)
    assert isinstance(got[1], StepReport) and got[1].step == 2 and len(got) == 2


def test_live_source_catches_up_without_a_reachable_pub() -> None:
    """With the PUB endpoint unreachable (e.g. a tunnel that forwards only the viewer port),
    updates still arrive through the periodic catch-up requests, in order."""
    with Collector() as col:
        pub = Publisher(col.ingest_address)
        pub.set_sticky(hello(0))
        send_until(pub, report(1))
        src = LiveSource(col.viewer_address, pub_address="tcp://127.0.0.1:1")
        assert collect(src, 2) == [hello(0), report(1)]
        for step in (2, 3):
            assert pub.send(report(step))
        assert collect(src, 2, timeout=5) == [report(2), report(3)]
        pub.close()
        src.close()


def test_a_busy_port_fails_start_and_leaves_no_trace(tmp_path: Path) -> None:
    with Collector() as first:
        port = int(first.ingest_address.rsplit(":", 1)[1])
        with pytest.raises(OSError, match=f"cannot bind 127.0.0.1:{port}: Address already in use"):
            Collector(port=port, record=tmp_path / "t.zst").start()
    assert not (tmp_path / "t.zst").exists()


def test_publisher_with_a_wrong_token_is_refused_at_the_handshake() -> None:
    """The token is checked when the connection is made: a wrong one is refused, the sender
    knows it at once (``refused``) and drops what it sends without ever blocking."""
    with Collector(token=b"s3cret") as col:
        good, bad = Publisher(col.ingest_address, b"s3cret"), Publisher(col.ingest_address, b"x")
        for pub in (good, bad):
            pub.set_sticky(hello(0))
        send_until(good, report(1))
        assert not bad.wait_connected(10) and bad.refused.startswith("wrong token")
        t0 = time.perf_counter()
        assert not any(bad.send(report(s)) for s in range(2, 50))
        assert time.perf_counter() - t0 < 5 and bad.dropped >= 48  # (a blocking send hangs)
        assert wait_for(lambda: col.accepted == 2)
        good.close()
        bad.close()
    assert (col.received, col.accepted, col.unauthenticated, col.duplicate_hellos) == (2, 2, 1, 0)
    assert col.stats()["refused_connections"] == {"unauthenticated": 1}
