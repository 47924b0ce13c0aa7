"""A node's relay: its ranks report here, and one connection carries everything to the collector.

At thousands of ranks the collector would otherwise hold one TCP connection, one handshake and
one reconnection storm per rank. A relay per node turns that into one connection per node:

- the node's ranks PUSH to the relay exactly as they would to the collector (same framing,
  same PLAIN handshake), and the relay's door is the collector's own
  :class:`~zeroscope.collector.gate.Gate` with the same token: the same refusals, for the same
  reasons, counted the same way. Its records (who it turned away, who connected and sent
  nothing) travel to the collector like reports and name the node's ranks there;
- the ranks' messages leave the node-facing socket through ZeroMQ's own proxy
  (``zmq.proxy_steerable``, with a control socket to stop it) into the uplink
  (collector/uplink.py), which owns the one connection to the collector, decodes each message
  on the node and sends the StepReports as node batches (collector/relay_batch.py: the
  reports' bytes as sent, a header the collector takes them by without decoding one, and the
  node's aggregate per step), anything else merged as an agent's batch;
- the buffer is bounded: the uplink queues at most ``buffer`` batches while the collector is
  slow or restarting (kept, delivered once it is back), then it waits, the proxy stops reading,
  the frontend fills, and each rank's own non-blocking sender drops and counts
  (agent/publish.py): the count rides on the rank's next report, so the collector's
  ``dropped_by_agents`` says what was lost, as it does without a relay;
- a restarted collector knows no rank: the uplink keeps every rank's newest Hello and sends them
  again whenever its connection is made anew;
- twice a second it sends a beat (``[RELAY_BEAT, token]``) unless a node batch went in that
  half second (the collector counts one as a beat), so the collector can tell a quiet node
  from a dead relay and name the node's ranks (collector/relays.py).
"""

from __future__ import annotations

import os
import socket
import threading
import time

import zmq

from zeroscope.agent import schema
from zeroscope.agent.schema import SenderClaim
from zeroscope.collector.gate import Gate
from zeroscope.collector.uplink import Uplink

BUFFER = 2_000
"""Batches the relay holds for the collector (each at most ``uplink.MAX_BATCH`` messages, or
``relay_batch.MAX_REPORTS`` reports in a node batch)."""

FRONTEND_HWM = 10_000
"""Messages the node-facing socket buffers before the ranks' own senders see EAGAIN."""


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
        self.uplink: Uplink | None = None
        self.local_dropped = 0
        """The relay's own door records it could not queue."""
        self.address = ""
        self._ctx: zmq.Context | None = None
        self._tag = os.urandom(4).hex()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    # -- what the uplink counted ------------------------------------------------------------

    @property
    def hellos(self) -> dict[int, bytes]:
        """The newest Hello per rank seen through this relay."""
        return self.uplink.hellos if self.uplink is not None else {}

    @property
    def forwarded(self) -> int:
        """Reports handed to the collector's connection."""
        return self.uplink.forwarded if self.uplink is not None else 0

    @property
    def node_batches(self) -> int:
        """Node batches (StepReports the collector takes without decoding) sent."""
        return self.uplink.node_batches if self.uplink is not None else 0

    @property
    def unbatched(self) -> int:
        """Reports sent as plain messages because their node batch could not be encoded."""
        return self.uplink.unbatched if self.uplink is not None else 0

    @property
    def connections(self) -> int:
        """Successful handshakes with the collector (more than one: it came back)."""
        return self.uplink.connections if self.uplink is not None else 0

    @property
    def hellos_resent(self) -> int:
        return self.uplink.hellos_resent if self.uplink is not None else 0

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
        front.bind(local)  # the relay's own door records: inproc skips the handshake
        claim = SenderClaim(role="relay", node_rank=self.node_rank, hostname=self.hostname)
        uplink = self.uplink = Uplink(ctx, self.collector, self.token, claim, self.buffer)
        back = ctx.socket(zmq.PUSH)
        back.setsockopt(zmq.SNDHWM, FRONTEND_HWM)
        back.setsockopt(zmq.LINGER, 0)
        back.connect(uplink.endpoint)
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

        def proxy() -> None:
            try:
                zmq.proxy_steerable(front, back, None, control)
            except zmq.ZMQError:
                pass  # the context ended under it
            finally:
                for s in (front, back, control):
                    s.close(linger=0)

        self._threads = [
            threading.Thread(target=proxy, name="zeroscope-relay-proxy", daemon=True),
            threading.Thread(
                target=uplink.run, args=(self._stop,), name="zeroscope-relay-uplink", daemon=True
            ),
            threading.Thread(
                target=self._warden,
                args=(zap, own, steer),
                name="zeroscope-relay-door",
                daemon=True,
            ),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop forwarding (what the buffer still holds is dropped: the relay is going away)."""
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

    # -- the door ----------------------------------------------------------------------------

    def _warden(self, zap: zmq.Socket, own: zmq.Socket, steer: zmq.Socket) -> None:
        """Answer the ranks' handshakes and send the door's records (the Gate is not shared
        with another thread); at the end, stop the proxy."""
        next_records = 0.0
        try:
            while not self._stop.is_set():
                if zap.poll(50):
                    self.gate.answer(zap)
                now = time.monotonic()
                if now >= next_records:
                    next_records = now + 0.25
                    self._door_records(own, final=False)
            self._door_records(own, final=True)
            steer.send(b"TERMINATE")
        finally:
            for s in (zap, own, steer):
                s.close(linger=0)

    def _door_records(self, own: zmq.Socket, *, final: bool) -> None:
        records = self.gate.due(self.hellos.__contains__, final=final)
        if not records:
            return
        try:
            own.send_multipart([self.token, *(schema.encode(r) for r in records)], zmq.NOBLOCK)
        except zmq.Again:
            self.local_dropped += 1
