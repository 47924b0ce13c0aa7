"""A node relay's one connection to the collector: batches, beats, and Hellos after a reconnection.

ZeroMQ's proxy hands every message the node's ranks sent to this thread over an inproc pipe.
The collector's cost is per report (decode, validate, record, publish), so the uplink decodes
each message here, on the node: the StepReports go as node batches (collector/relay_batch.py:
each report as sent with the summary every view needs of it made here, a header the collector
takes them by without decoding them, and the node's aggregate per step), anything else
(Hellos, events, heartbeats, byes, the door's records) as one ``[token, message, ...]``
message of at most ``MAX_BATCH``, the framing the collector takes from an agent's batch, in
the order they came. Nothing waits to fill a batch:
what one wake-up finds goes at once, so batches grow only when the node sends faster than the
collector reads.

Only messages whose token frame is the job's token are merged (the door admitted the sender
with it); anything else goes on as it came, so the collector rejects it with its own reason.
"""

from __future__ import annotations

import threading
import time

import zmq
from zmq.utils.monitor import parse_monitor_message

from zeroscope.agent import schema
from zeroscope.agent.schema import SenderClaim
from zeroscope.collector.protocol import NODE_BATCH, RELAY_BEAT
from zeroscope.collector.relay_batch import NodeBatcher, UnsendableBatch

MAX_BATCH = 64
"""Reports per forwarded message at most (as an agent's own batches)."""

BEAT_INTERVAL_S = 0.5
"""How often the relay says it is alive (the collector names it unreachable after a few)."""

SEND_WAIT_MS = 200
"""A send that finds the buffer full waits this long, then checks whether the relay stops."""


class Uplink:
    """Owns the inproc end of the proxy and the PUSH to the collector (see module doc)."""

    def __init__(
        self, ctx: zmq.Context, collector: str, token: bytes, claim: SenderClaim, buffer: int
    ) -> None:
        self.token = token
        self.handoff = ctx.socket(zmq.PULL)
        self.handoff.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"inproc://zeroscope-relay-handoff-{id(self):x}"
        self.handoff.bind(self.endpoint)
        up = self.up = ctx.socket(zmq.PUSH)
        up.setsockopt(zmq.SNDHWM, buffer)
        up.setsockopt(zmq.SNDTIMEO, SEND_WAIT_MS)
        up.setsockopt(zmq.LINGER, 0)
        up.setsockopt(zmq.RECONNECT_IVL, 100)
        up.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        up.plain_username = claim.username()
        up.plain_password = token or b"-"
        self.monitor = up.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        up.connect(collector)
        self.hellos: dict[int, bytes] = {}
        """The newest Hello per rank seen through this relay (re-sent to a new collector)."""
        self.forwarded = 0
        """Reports handed to the collector's connection."""
        self.batches = 0
        """ZeroMQ messages they went in."""
        self.connections = 0
        """Handshakes with the collector that succeeded (more than one: it was restarted)."""
        self.hellos_resent = 0
        self.batcher = NodeBatcher(claim.node_rank, claim.hostname)
        """The node's StepReports waiting to go as one node batch (collector/relay_batch.py)."""
        self.node_batches = 0
        """ZeroMQ messages that were node batches."""
        self._batch_sent_at = float("-inf")
        self.unbatched = 0
        """Reports sent as plain messages because their node batch could not be encoded."""

    def run(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(self.handoff, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        next_beat = 0.0
        try:
            while not stop.is_set():
                events = dict(poller.poll(50))
                if self.monitor in events:
                    self._reconnected(stop)
                if self.handoff in events:
                    self._forward(stop)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + BEAT_INTERVAL_S
                    # A node batch is a beat too (the collector notes it as one).
                    if now - self._batch_sent_at >= BEAT_INTERVAL_S:
                        self._send([RELAY_BEAT, self.token], stop, wait=False)
        finally:
            self.up.disable_monitor()
            for s in (self.handoff, self.up, self.monitor):
                s.close(linger=0)

    def _forward(self, stop: threading.Event) -> None:
        """What is waiting (a bounded amount per turn, so beats still go), in arrival order:
        StepReports in node batches, anything else in plain batches."""
        plain: list[bytes] = []
        batcher = self.batcher
        for _ in range(16 * MAX_BATCH):
            try:
                frames = self.handoff.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) < 2 or frames[0] != self.token:
                plain = self._send_plain(plain, stop)
                self._send(frames, stop)  # the collector's door says what is wrong with it
                continue
            for payload in frames[1:]:
                try:
                    message: schema.Message | None = schema.decode(payload)
                except schema.SchemaError:
                    message = None  # goes on as it came: the collector rejects and counts it
                if isinstance(message, schema.StepReport):
                    plain = self._send_plain(plain, stop)
                    batcher.add(message, payload)
                    if batcher.full:
                        self._send_reports(stop)
                    continue
                if isinstance(message, schema.Hello):
                    self.hellos[message.rank] = payload
                    batcher.hello(message)
                if len(batcher):
                    self._send_reports(stop)
                plain.append(payload)
                if len(plain) >= MAX_BATCH:
                    plain = self._send_plain(plain, stop)
        self._send_plain(plain, stop)
        if len(batcher):
            self._send_reports(stop)

    def _send_plain(self, payloads: list[bytes], stop: threading.Event) -> list[bytes]:
        """Send ``payloads`` as one ``[token, message, ...]``; returns a new empty list."""
        if payloads and self._send([self.token, *payloads], stop):
            self.forwarded += len(payloads)
            self.batches += 1
        return []

    def _send_reports(self, stop: threading.Event) -> None:
        try:
            frames, n = self.batcher.take()
        except UnsendableBatch as unsendable:
            # Sums a node batch cannot carry (relay_batch.py): the reports go plain, as an
            # agent's batch goes, and the collector folds them as it folds a direct rank's.
            self.unbatched += len(unsendable.payloads)
            for i in range(0, len(unsendable.payloads), MAX_BATCH):
                self._send_plain(unsendable.payloads[i : i + MAX_BATCH], stop)
            return
        if self._send([NODE_BATCH, self.token, *frames], stop):
            self._batch_sent_at = time.monotonic()
            self.forwarded += n
            self.batches += 1
            self.node_batches += 1

    def _send(self, frames: list[bytes], stop: threading.Event, *, wait: bool = True) -> bool:
        """Queue ``frames`` for the collector; while the buffer is full, wait (the proxy then
        stops reading and the ranks' own senders drop and count) unless the relay stops."""
        while True:
            try:
                self.up.send_multipart(frames)
                return True
            except zmq.Again:
                if not wait or stop.is_set():
                    return False

    def _reconnected(self, stop: threading.Event) -> None:
        while self.monitor.poll(0):
            parse_monitor_message(self.monitor.recv_multipart())
            self.connections += 1
            if self.connections > 1 and self.hellos:
                # A new collector (or the old one after a network cut): tell it who the node's
                # ranks are, behind whatever the buffer still holds.
                hellos = list(self.hellos.values())
                for i in range(0, len(hellos), MAX_BATCH):
                    if self._send([self.token, *hellos[i : i + MAX_BATCH]], stop, wait=False):
                        self.hellos_resent += len(hellos[i : i + MAX_BATCH])
