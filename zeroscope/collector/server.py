"""The collector: receives every rank's messages, validates, records, and serves viewers.

One background thread owns three ZeroMQ sockets:

- ingest, a PULL bound to ``bind_host:port`` (127.0.0.1 by default; a non-loopback bind needs a
  per-job token): frames ``[token, msgpack, ...]`` (one or more messages; an agent sends what
  one wake-up of its sender found as one) from the agents' publishers, each connection
  authenticated in its handshake by :mod:`zeroscope.collector.gate` (which also says who was turned away);
- a PUB and a ROUTER bound on 127.0.0.1 for viewers (snapshot + live updates, see
  :mod:`zeroscope.collector.protocol`). Viewers on another machine come through ``ssh -L``.

Each accepted message is numbered, kept in memory for late joiners, appended to the SQLite trace
(when recording), published, and handed to in-process listeners, in arrival order. Every received
message is counted: ``received == accepted + sum(rejected.values())``. Senders turned away
(and ranks admitted that never report) become the collector's own ``Admission`` records, served
and recorded in the same stream.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq
from zmq.utils.monitor import parse_monitor_message

from zeroscope.agent import schema
from zeroscope.agent.schema import Message
from zeroscope.collector import protocol as proto
from zeroscope.collector.batch_ingest import BatchIngest
from zeroscope.collector.gate import HANDSHAKE_FAILURES, Gate, frame_origin
from zeroscope.collector.relays import RelayBook
from zeroscope.collector.snapshot import SNAPSHOT_BYTES, Snapshot
from zeroscope.collector.viewers import ViewerService
from zeroscope.store.background import BackgroundWriter
from zeroscope.store.thinning import ThinningPolicy
from zeroscope.store.trace import TraceWriter

Listener = Callable[[Message], None]

INGEST_HWM = 1_000
"""Messages the ingest socket buffers *per connection* (ZeroMQ's high-water mark is per pipe: a
rank's own connection, or a node relay's, whose messages are batches) while the collector is
behind; past it the socket stops reading that connection, the sender's own queue fills and the
rank drops and counts (agent/publish.py). A rank may so be 2,000 messages behind (its own send
queue again) before it drops: minutes of reports. It was 200,000, which held a backlog in full:
1024 synthetic ranks at 10 steps/s over two connections on a busy 2-core machine grew the
collector to 344 MiB of RSS beside a 32 MiB history cap; at 1,000 it peaked at 71 MiB, the
ranks dropping (and counting) what it could not take."""

VIEWER_HWM = 10_000
"""Updates queued per live viewer; past it a slow viewer's updates are dropped (the collector
never waits for a viewer) and the viewer repairs the gap from the snapshot history, which
holds them anyway. Each queued update is a copy held by the collector: at 100,000 a viewer
slowed by the same busy machine grew it to 330 MiB of RSS."""

HISTORY_BYTES = 256 * 1024 * 1024
"""Payload bytes kept in memory for viewers' snapshots; older ones are trimmed (Hellos are kept
forever). The trace file keeps everything."""

_BATCH = 2000
"""Messages ingested per turn of the loop before it serves viewers and commits the trace."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Collector(ViewerService, BatchIngest):
    """A job's collector. ``start()`` binds and runs it on a daemon thread; ``stop()`` ends it."""

    def __init__(
        self,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        record: Path | str | None = None,
        token: bytes | None = None,
        *,
        viewer_port: int = 0,
        history_bytes: int = HISTORY_BYTES,
        job_id: str = "",
        thinning: ThinningPolicy | None = ThinningPolicy(),  # noqa: B008 (frozen)
        snapshot_bytes: int = SNAPSHOT_BYTES,
    ) -> None:
        if not is_loopback(bind_host) and not token:
            raise ValueError(
                f"refusing to bind the collector on non-loopback address {bind_host!r} without a "
                "token: anyone who can reach it could inject data. Pass a token (agents read it "
                "from ZEROSCOPE_TOKEN) or bind 127.0.0.1 and tunnel with ssh -L."
            )
        if not 0 <= port < 65536:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self.bind_host = bind_host
        self.port = port
        self.viewer_port = viewer_port
        self.record = Path(record) if record is not None else None
        self.token = token or b""
        self.instance = os.urandom(8)
        self.history_bytes = history_bytes
        self.job_id = job_id
        """Recorded in the trace from the start, so a job whose ranks never report is named."""
        self.thinning = thinning
        self.snapshot = Snapshot()
        """Each rank's newest messages: a late viewer's catch-up (collector/snapshot.py)."""
        self.snapshot_bytes = snapshot_bytes
        """A catch-up with more history than this gets the snapshot instead."""
        """What the trace keeps of a big job's history (store/thinning.py; None: everything)."""

        self.received = 0
        self.accepted = 0
        self.rejected: dict[str, int] = {}
        self.dropped_by_agents = 0
        self.reports = 0
        """StepReports accepted (directly or in node batches)."""
        self.duplicate_hellos = 0
        self.listener_errors = 0
        self.internal_errors = 0
        self.last_error = ""
        self.recording_error = ""
        """Why recording stopped (disk full...), or "" while it works. Live serving goes on."""
        self.on_recording_stopped: Callable[[str], None] | None = None
        """Called once, on the collector thread, with ``recording_error`` (for an alert)."""

        self.seq = 0
        self._history: list[bytes] = []
        self._history_base = 0  # seq of _history[0] is _history_base + 1
        self._history_size = 0
        self._hellos: dict[tuple[str, int], tuple[int, bytes, schema.Hello]] = {}
        self._admissions: dict[tuple[str, str, int, int, str], tuple[int, bytes]] = {}
        """The newest Admission record per sender, kept (like Hellos) past history trimming."""
        self._reported: set[int] = set()
        self.gate = Gate(self.token)
        self.relays = RelayBook()
        """Node relays forwarding here, by their beats (collector/relays.py)."""
        self.batches = 0
        """Node relays' batches taken whole (collector/batch_ingest.py)."""
        self._claims: dict[bytes, schema.SenderClaim] = {}
        """Relays' handshake claims, parsed once per user name."""
        self._behind = False
        self._next_admissions = 0.0
        self._listeners: list[Listener] = []
        self._context: zmq.Context | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self.ingest_address = ""
        self.viewer_address = ""
        self.pub_address = ""
        self.trace: TraceWriter | BackgroundWriter | None = None
        """The trace, written on its own thread (store/background.py)."""

    # -- public ----------------------------------------------------------------------------

    @property
    def unauthenticated(self) -> int:
        """Messages with a wrong token plus connections refused for one."""
        return self.rejected.get("unauthenticated", 0) + self.gate.refused.get("unauthenticated", 0)

    def add_listener(self, callback: Listener) -> None:
        """``callback(message)`` for every accepted message, in order, on the collector thread
        (keep it quick; hand heavy work to another thread). Its exceptions are counted."""
        self._listeners.append(callback)

    def stats(self) -> dict[str, object]:
        return {
            "received": self.received,
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "unauthenticated": self.unauthenticated,
            "refused_connections": dict(self.gate.refused),
            "dropped_by_agents": self.dropped_by_agents,
            "reports": self.reports,
            "duplicate_hellos": self.duplicate_hellos,
            "listener_errors": self.listener_errors,
            "internal_errors": self.internal_errors,
            "recording_error": self.recording_error,
            "seq": self.seq,
            "relays": len(self.relays),
            "node_batches": self.batches,
        }

    def start(self) -> Collector:
        """Bind the sockets (errors raise here) and start serving on a background thread."""
        self._thread = threading.Thread(target=self._run, name="zeroscope-collector", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._start_error is not None:
            raise self._start_error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving; the trace is committed and closed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loop --------------------------------------------------------------------------

    def _bind(self, ctx: zmq.Context) -> tuple[zmq.Socket, ...]:
        """(ingest, viewers' ROUTER, PUB, ZAP handler, ingest monitor)."""
        zap = self.gate.open(ctx)
        pull = ctx.socket(zmq.PULL)
        self.gate.guard(pull)
        pull.setsockopt(zmq.RCVHWM, INGEST_HWM)
        pull.setsockopt(zmq.LINGER, 0)
        pull.setsockopt(zmq.MAXMSGSIZE, schema.MAX_MESSAGE_BYTES + 1024)
        if ":" in self.bind_host:
            pull.setsockopt(zmq.IPV6, 1)
        host = f"[{self.bind_host}]" if ":" in self.bind_host else self.bind_host
        pull.bind(f"tcp://{host}:{self.port or '*'}")
        self.ingest_address = pull.getsockopt_string(zmq.LAST_ENDPOINT)
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(f"tcp://127.0.0.1:{self.viewer_port or '*'}")
        self.viewer_address = router.getsockopt_string(zmq.LAST_ENDPOINT)
        pub = ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, VIEWER_HWM)
        pub.bind("tcp://127.0.0.1:*")
        self.pub_address = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        monitor = pull.get_monitor_socket(HANDSHAKE_FAILURES)
        return pull, router, pub, zap, monitor

    def _run(self) -> None:
        ctx = self._context = zmq.Context()
        try:
            try:
                pull, router, pub, zap, monitor = self._bind(ctx)
            except zmq.ZMQError as exc:
                # An OSError with the address in it, e.g. "... 127.0.0.1:5555: Address already
                # in use", so callers report it in one line like any other socket error.
                raise OSError(
                    exc.errno, f"cannot bind {self.bind_host}:{self.port}: {exc}"
                ) from None
            # The trace is created only once the sockets are bound: a busy port leaves no file.
            if self.record is not None:
                self.trace = BackgroundWriter(
                    TraceWriter(self.record, job_id=self.job_id, thinning=self.thinning)
                )
        except BaseException as exc:
            self._start_error = exc
            self._ready.set()
            ctx.destroy(linger=0)
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(pull, zmq.POLLIN)
        poller.register(router, zmq.POLLIN)
        poller.register(zap, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(50))
                if zap in events:
                    self.gate.answer(zap)
                if monitor in events:
                    self._handshake_failures(monitor)
                if pull in events:
                    self._drain(pull, pub)
                if router in events:
                    self._serve_viewers(router)
                self._emit_admissions(pub)
                if self.trace is not None:
                    try:
                        self.trace.maybe_commit()
                    except Exception as exc:
                        self.stop_recording(exc)
            self._drain(pull, pub)
            self._emit_admissions(pub, final=True)
        finally:
            if self.trace is not None:
                self.trace.close()
            pull.disable_monitor()
            for s in (pull, router, pub, zap, monitor):
                s.close(linger=0)
            ctx.term()

    def _drain(self, pull: zmq.Socket, pub: zmq.Socket) -> None:
        taken = 0
        self._behind = True
        while taken < _BATCH:  # schema messages: an agent's batch counts as what it holds
            try:
                # The first frame as a zmq.Frame: it knows the sender's address and claim, asked
                # for only when the message is rejected.
                first = pull.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self._behind = False
                return
            frames = [first.bytes]
            more = first.more  # (cheaper than asking the socket: as fast as recv_multipart)
            while more:
                frames.append(pull.recv())
                more = bool(pull.getsockopt(zmq.RCVMORE))
            try:
                if frames[0] == proto.NODE_BATCH:  # a relay's node batch: its reports count
                    taken += self._node_batch(frames, pub, first)
                    continue
                taken += max(len(frames) - 1, 1)  # the messages after the token
                if frames[0] == proto.RELAY_BEAT:
                    self._relay_beat(frames, pub, first)
                    continue
                self.ingest(frames, pub, first)
            except Exception as exc:  # e.g. the trace's disk is full: count, keep serving
                self.internal_errors += 1
                self.last_error = f"ingest failed: {exc!r}"

    def _reject(
        self, reason: str, detail: str, source: zmq.Frame | None = None, count: int = 1
    ) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + count
        self.last_error = detail
        peer, user = frame_origin(source)
        self.gate.note(reason, peer, user, detail)

    def _handshake_failures(self, monitor: zmq.Socket) -> None:
        for _ in range(100):
            try:
                event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            self.gate.handshake_failed(f"ZeroMQ handshake failed (event {event['event']})")

    def ingest(
        self, frames: list[bytes], pub: zmq.Socket | None = None, source: zmq.Frame | None = None
    ) -> Message | None:
        """Count, authenticate, validate, number, record, publish and hand out the messages of
        one ZeroMQ message, ``[token, message, ...]``; returns the last one accepted.
        ``source``: the received first frame, which can say who sent a rejected message."""
        if len(frames) < 2:
            self.received += 1
            self._reject("framing", f"{len(frames)} frame, expected [token, message, ...]", source)
            return None
        token, *payloads = frames
        self.received += len(payloads)
        if self.token and not hmac.compare_digest(token, self.token):
            self._reject("unauthenticated", "wrong or missing token", source, len(payloads))
            return None
        accepted = None
        for payload in payloads:
            accepted = self._admit(payload, pub, source) or accepted
        return accepted

    def _admit(
        self, payload: bytes, pub: zmq.Socket | None, source: zmq.Frame | None
    ) -> Message | None:
        """One authenticated message: validated, then published unless it is a duplicate."""
        try:
            message = schema.decode(payload)
        except schema.SchemaError as exc:
            self._reject(exc.reason, str(exc), source)
            return None
        if isinstance(message, schema.Admission) and not self._from_relay(source):
            self._reject("malformed", "an admission record is the collector's own", source)
            return None
        self.accepted += 1
        if isinstance(message, schema.Hello):
            key = (message.job_id, message.rank)
            seen = self._hellos.get(key)
            if seen is not None and seen[2] == message:
                self.duplicate_hellos += 1  # re-announced after a reconnect
                return None
        elif isinstance(message, (schema.StepReport, schema.Heartbeat)):
            self.dropped_by_agents += message.dropped
            self.reports += isinstance(message, schema.StepReport)
        self._publish(message, payload, pub)
        return message

    def _publish(self, message: Message, payload: bytes, pub: zmq.Socket | None) -> None:
        """Number, remember, record, publish and hand out one accepted message or record."""
        self.seq += 1
        seq = self.seq
        if isinstance(message, schema.Hello):
            self._hellos[(message.job_id, message.rank)] = (seq, payload, message)
            self._reported.add(message.rank)
            if self.trace is not None and not self.trace.job_id:
                self.trace.set_job_id(message.job_id)
        elif isinstance(message, schema.Admission):
            m = message
            self._admissions[(m.reason, m.peer, m.rank, m.node_rank, m.role)] = (seq, payload)
        self._remember(payload)
        self.snapshot.note(seq, message, payload)
        if self.trace is not None:
            try:
                self.trace.append(message, payload)
            except Exception as exc:  # disk full, file removed...: keep serving live viewers
                self.stop_recording(exc)
        if pub is not None:
            pub.send_multipart([proto.update_header(self.instance, seq), payload])
        for listener in self._listeners:
            try:
                listener(message)
            except Exception as exc:
                self.listener_errors += 1
                self.last_error = f"listener {listener!r} raised {exc!r}"

    def _emit_admissions(self, pub: zmq.Socket, *, final: bool = False) -> None:
        """The gate's records whose totals moved, into the stream (checked 4 times a second)."""
        now = time.monotonic()
        if not final and now < self._next_admissions:
            return
        self._next_admissions = now + 0.25
        try:
            records = self.gate.due(self._reported.__contains__, final=final)
            # Behind on ingest, a relay's beats wait in the queue: silence would be ours.
            silent = [] if self._behind else self.relays.due()
            for record in [*records, *silent]:
                self._publish(record, schema.encode(record), pub)
        except Exception as exc:  # never let bookkeeping stop ingest
            self.internal_errors += 1
            self.last_error = f"admission records failed: {exc!r}"

    @staticmethod
    def _from_relay(source: zmq.Frame | None) -> bool:
        """Whether ``source`` came over a node relay's connection (its door's records too)."""
        return schema.SenderClaim.parse(frame_origin(source)[1]).role == "relay"

    def _relay_beat(self, frames: list[bytes], pub: zmq.Socket, source: zmq.Frame) -> None:
        """``[RELAY_BEAT, token]``: a node relay is alive (not a message, not counted)."""
        peer, claim = self._relay_claim(source)
        token = frames[1] if len(frames) == 2 else b""
        if claim.role != "relay" or (self.token and not hmac.compare_digest(token, self.token)):
            self.received += 1
            self._reject("framing", "a relay beat from a sender that is not a relay", source)
            return
        record = self.relays.beat(claim, peer)
        if record is not None:
            self._publish(record, schema.encode(record), pub)

    def stop_recording(self, exc: BaseException) -> None:
        """A trace write failed (disk full, file too large, file removed): stop recording for
        good rather than retry on every message, keep what was committed (it replays), keep
        serving live viewers, and say so once."""
        self.internal_errors += 1
        trace, self.trace = self.trace, None
        if trace is None:
            return
        try:
            trace.close()  # commits what it still can
        except Exception:
            pass
        kept = f"after step {trace.last_step}" if trace.last_step is not None else "before step 1"
        self.recording_error = self.last_error = (
            f"recording stopped {kept}: trace write failed ({exc}); the run goes on"
        )
        if self.on_recording_stopped is not None:
            try:
                self.on_recording_stopped(self.recording_error)
            except Exception:
                self.listener_errors += 1


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (for tests and the run verb)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
