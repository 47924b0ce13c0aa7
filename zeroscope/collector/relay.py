"""A node's relay: its ranks report here, and one connection carries everything to the collector.

At thousands of ranks the collector would otherwise hold one TCP connection, one handshake and
one reconnection storm per rank. A relay per node turns that into one connection per node:

- the node's ranks PUSH to the relay exactly as they would to the collector (same framing,
  same PLAIN handshake), and the relay's door is the collector's own
  :class:`~zeroscope.collector.gate.Gate` with the same token: the same refusals, for the same
  reasons, counted the same way. Its records (who it turned away, who connected and sent
  nothing) travel to the collector like reports and name the node's ranks there;
- the forwarding itself is ZeroMQ's own proxy (``zmq.proxy_steerable``: frontend PULL, backend
  PUSH to the collector, a capture socket, a control socket to stop it). ZeroMQ's I/O thread
  writes what the proxy queued as few TCP writes as it can, so the ranks' reports reach the
  collector in batches on that one connection;
- the buffer is bounded: the backend queues at most ``buffer`` messages while the collector is
  slow or restarting (kept, delivered once it is back), then the proxy stops reading, the
  frontend fills, and each rank's own non-blocking sender drops and counts (agent/publish.py):
  the count rides on the rank's next report, so the collector's ``dropped_by_agents`` says what
  was lost, as it does without a relay;
- a restarted collector knows no rank: the relay keeps every rank's newest Hello (read off the
  proxy's capture) and sends them again whenever its connection is made anew;
- every ``BEAT_INTERVAL_S`` it sends a beat (``[RELAY_BEAT, token]``), so the collector can tell
  a quiet node from a dead relay and name the node's ranks (collector/relays.py).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import msgspec
import zmq
from zmq.utils.monitor import parse_monitor_message

from zeroscope.agent import schema
from zeroscope.agent.schema import SenderClaim
from zeroscope.collector.gate import Gate
from zeroscope.collector.protocol import RELAY_BEAT

BUFFER = 100_000
"""Messages the relay holds for the collector (its backend's send high-water mark)."""

FRONTEND_HWM = 10_000
"""Messages the node-facing socket buffers before the ranks' own senders see EAGAIN."""

BEAT_INTERVAL_S = 0.5
"""How often the relay says it is alive (the collector names it unreachable after a few)."""

_HELLO_TAG = msgspec.msgpack.encode("kind") + msgspec.msgpack.encode("hello")
"""A Hello's first key and tag as msgpack; found in its first bytes (after the map header)."""


def is_hello(payload: bytes) -> bool:
    """Whether ``payload`` is an encoded Hello, without decoding it (the capture sees every
    report; only Hellos are kept)."""
    return payload.find(_HELLO_TAG, 0, 16) >= 0


class Relay:
    """One node's relay. ``start()`` binds and runs it on background threads; ``stop()``."""

    def __init__(
        self,
        collector: str,
        *,
        bind_host: str = "127.0.0.1",
        port: int = 0,
        token: bytes = b"",
        node_rank: int = 0,
        hostname: str = "",
        buffer: int = BUFFER,
    ) -> None:
        self.collector = collector
        self.bind_host = bind_host
        self.port = port
        self.token = token
        self.node_rank = node_rank
        self.hostname = hostname or socket.gethostname()
        self.buffer = buffer
        self.gate = Gate(token)
        self.hellos: dict[int, bytes] = {}
        """The newest Hello per rank seen through this relay (re-sent to a new collector)."""
        self.forwarded = 0
        """Messages seen on the proxy's capture (every message forwarded, unless the capture
        itself fell behind: it never slows the proxy)."""
        self.connections = 0
        """Handshakes with the collector that succeeded (more than one: it was restarted)."""
        self.hellos_resent = 0
        self.local_dropped = 0
        """The relay's own messages (beats, Hellos, door records) it could not queue."""
        self.address = ""
        self._ctx: zmq.Context | None = None
        self._tag = os.urandom(4).hex()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._local_socket: zmq.Socket | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> Relay:
        """Bind the node-facing socket (errors raise here), connect to the collector, and
        start forwarding."""
        ctx = self._ctx = zmq.Context()
        zap = self.gate.open(ctx)
        front = ctx.socket(zmq.PULL)
        self.gate.guard(front)
        front.setsockopt(zmq.RCVHWM, FRONTEND_HWM)
        front.setsockopt(zmq.LINGER, 0)
        front.setsockopt(zmq.MAXMSGSIZE, schema.MAX_MESSAGE_BYTES + 1024)
        host = f"[{self.bind_host}]" if ":" in self.bind_host else self.bind_host
        if ":" in self.bind_host:
            front.setsockopt(zmq.IPV6, 1)
        try:
            front.bind(f"tcp://{host}:{self.port or '*'}")
        except zmq.ZMQError as exc:
            front.close(linger=0)
            zap.close(linger=0)
            ctx.destroy(linger=0)
            raise OSError(exc.errno, f"cannot bind {self.bind_host}:{self.port}: {exc}") from None
        self.address = front.getsockopt_string(zmq.LAST_ENDPOINT)
        local = f"inproc://zeroscope-relay-{self._tag}"
        front.bind(local)  # the relay's own messages: inproc skips the handshake
        back = ctx.socket(zmq.PUSH)
        back.setsockopt(zmq.SNDHWM, self.buffer)
        back.setsockopt(zmq.LINGER, 0)
        back.setsockopt(zmq.RECONNECT_IVL, 100)
        back.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        back.plain_username = SenderClaim(
            role="relay", node_rank=self.node_rank, hostname=self.hostname
        ).username()
        back.plain_password = self.token or b"-"
        monitor = back.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        back.connect(self.collector)
        capture = ctx.socket(zmq.PUB)
        capture.setsockopt(zmq.SNDHWM, FRONTEND_HWM)
        capture.setsockopt(zmq.LINGER, 0)
        capture.bind(f"inproc://zeroscope-relay-capture-{self._tag}")
        captured = ctx.socket(zmq.SUB)
        captured.setsockopt(zmq.SUBSCRIBE, b"")
        captured.setsockopt(zmq.RCVHWM, FRONTEND_HWM)
        captured.setsockopt(zmq.LINGER, 0)
        captured.connect(f"inproc://zeroscope-relay-capture-{self._tag}")
        control = ctx.socket(zmq.PAIR)
        control.setsockopt(zmq.LINGER, 0)
        control.bind(f"inproc://zeroscope-relay-control-{self._tag}")
        steer = ctx.socket(zmq.PAIR)
        steer.setsockopt(zmq.LINGER, 0)
        steer.connect(f"inproc://zeroscope-relay-control-{self._tag}")
        own = ctx.socket(zmq.PUSH)
        own.setsockopt(zmq.SNDHWM, FRONTEND_HWM)
        own.setsockopt(zmq.LINGER, 0)
        own.connect(local)
        self._local_socket = own

        def proxy() -> None:
            try:
                zmq.proxy_steerable(front, back, capture, control)
            except zmq.ZMQError:
                pass  # the context ended under it
            finally:
                back.disable_monitor()
                for s in (front, back, capture, control):
                    s.close(linger=0)

        self._threads = [
            threading.Thread(target=proxy, name="zeroscope-relay-proxy", daemon=True),
            threading.Thread(
                target=self._warden,
                args=(zap, captured, monitor, steer),
                name="zeroscope-relay-warden",
                daemon=True,
            ),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop forwarding (what the backend still holds is dropped: the relay is going away)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
        self._threads = []
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the warden: door, Hellos, reconnections, beats -------------------------------------

    def _warden(
        self, zap: zmq.Socket, captured: zmq.Socket, monitor: zmq.Socket, steer: zmq.Socket
    ) -> None:
        own = self._local_socket
        assert own is not None
        poller = zmq.Poller()
        for s in (zap, captured, monitor):
            poller.register(s, zmq.POLLIN)
        next_beat = next_records = 0.0
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(50))
                if zap in events:
                    self.gate.answer(zap)
                if captured in events:
                    self._read_capture(captured)
                if monitor in events:
                    self._reconnected(monitor, own)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + BEAT_INTERVAL_S
                    self._send_own(own, [RELAY_BEAT, self.token])
                if now >= next_records:
                    next_records = now + 0.25
                    self._door_records(own, final=False)
            self._door_records(own, final=True)
            steer.send(b"TERMINATE")
        finally:
            for s in (zap, captured, monitor, steer, own):
                s.close(linger=0)

    def _read_capture(self, captured: zmq.Socket) -> None:
        for _ in range(10_000):
            try:
                frames = captured.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames[0] == RELAY_BEAT:
                continue
            self.forwarded += max(len(frames) - 1, 1)
            for payload in frames[1:]:
                if is_hello(payload):
                    try:
                        hello = schema.decode(payload)
                    except schema.SchemaError:
                        continue  # the collector rejects and counts it
                    if isinstance(hello, schema.Hello):
                        self.hellos[hello.rank] = payload

    def _reconnected(self, monitor: zmq.Socket, own: zmq.Socket) -> None:
        while monitor.poll(0):
            parse_monitor_message(monitor.recv_multipart())
            self.connections += 1
            if self.connections > 1 and self.hellos:
                # A new collector (or the old one after a network cut): tell it who the
                # node's ranks are, behind whatever the backend still holds.
                hellos = list(self.hellos.values())
                for i in range(0, len(hellos), 64):
                    if self._send_own(own, [self.token, *hellos[i : i + 64]]):
                        self.hellos_resent += len(hellos[i : i + 64])

    def _door_records(self, own: zmq.Socket, *, final: bool) -> None:
        records = self.gate.due(self._heard, final=final)
        if records:
            self._send_own(own, [self.token, *(schema.encode(r) for r in records)])

    def _heard(self, rank: int) -> bool:
        return rank in self.hellos

    def _send_own(self, own: zmq.Socket, frames: list[bytes]) -> bool:
        try:
            own.send_multipart(frames, zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.local_dropped += 1
            return False
