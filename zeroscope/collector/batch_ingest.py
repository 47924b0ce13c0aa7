"""The collector's side of a node relay's batch: a node's StepReports taken without decoding.

Measured (bench/relay_ingest.py, docs/bench.md): the collector's CPU goes per report, into
decoding and validating it, numbering and remembering it, recording it, and publishing it as
one ZeroMQ message to viewers; batching the ZeroMQ messages alone saved nothing. A relay's
batch (``[NODE_BATCH, token, header, body]``, agent/node_batch.py) carries each report's
bytes as its rank sent them and, in its header, what the collector needs of each (rank, step,
instant, drop count) and of each node (the aggregate the trace's ``node_steps`` rows hold), so
here a batch of n reports costs one header decode, n slices of the body, n history and
snapshot notes, n trace rows written on the trace's own thread, and one ZeroMQ message of
three frames to viewers (an update of n consecutive sequence numbers, collector/protocol.py). The relay
decoded and validated every report on its node; the trace and the viewers get the same bytes a
direct rank's report would have put there.

An in-process listener (``zeroscope run``'s own view) takes decoded messages, so while one is
registered a batch is taken message by message, as a direct sender's are.

A mixin of :class:`zeroscope.collector.server.Collector`, which owns the attributes named
below and calls :meth:`_node_batch` on its one thread.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import TYPE_CHECKING

import zmq

from zeroscope.agent import schema
from zeroscope.collector import protocol as proto
from zeroscope.collector.gate import frame_origin
from zeroscope.collector.relays import RelayBook
from zeroscope.collector.snapshot import Snapshot
from zeroscope.store.background import BackgroundWriter
from zeroscope.store.trace import TraceWriter

_STEP_TAG = b"\xa4kind\xa4step"
"""A StepReport's first key and tag as msgpack (``"kind": "step"``), right after the map header:
the one check of a report's bytes the collector makes (the relay validated each)."""


class BatchIngest:
    """A node relay's batches (see the module doc)."""

    token: bytes
    instance: bytes
    seq: int
    received: int
    accepted: int
    dropped_by_agents: int
    reports: int
    snapshot: Snapshot
    trace: TraceWriter | BackgroundWriter | None
    _listeners: list[Callable[[schema.Message], None]]
    _claims: dict[bytes, schema.SenderClaim]
    relays: RelayBook

    batches = 0
    """Node batches taken whole (class default; the collector counts its own)."""

    if TYPE_CHECKING:  # the collector's own (server.py, viewers.py)

        def _reject(
            self, reason: str, detail: str, source: zmq.Frame | None = None, count: int = 1
        ) -> None: ...

        def _remember(self, payload: bytes) -> None: ...

        def _admit(
            self, payload: bytes, pub: zmq.Socket | None, source: zmq.Frame | None
        ) -> schema.Message | None: ...

        def stop_recording(self, exc: BaseException) -> None: ...

        def _publish(
            self, message: schema.Message, payload: bytes, pub: zmq.Socket | None
        ) -> None: ...

    def _node_batch(self, frames: list[bytes], pub: zmq.Socket | None, source: zmq.Frame) -> int:
        """Take one batch; returns how many reports it held (what the loop counts)."""
        peer, claim = self._relay_claim(source)
        if len(frames) != 4:
            self.received += 1
            self._reject("framing", f"node batch of {len(frames)} frames, expected 4", source)
            return 1
        _, token, header, body = frames
        try:
            batch = schema.decode_batch(header)
        except schema.BatchError as exc:
            self.received += 1
            self._reject(exc.reason, str(exc), source)
            return 1
        entries = batch.entries
        n = len(entries)
        if n == 0:
            return 0
        self.received += n
        if claim.role != "relay":
            self._reject("framing", "a node batch from a sender that is not a relay", source, n)
            return n
        if self.token and not hmac.compare_digest(token, self.token):
            self._reject("unauthenticated", "wrong or missing token", source, n)
            return n
        if sum(e.size for e in entries) != len(body):
            self._reject("malformed", "node batch sizes do not add up to its body", source, n)
            return n
        record = self.relays.beat(claim, peer)  # a batch says the relay is alive, as a beat
        if record is not None:
            self._publish(record, schema.encode(record), pub)
        payloads = []
        at = 0
        for e in entries:
            payload = body[at : at + e.size]
            if payload.find(_STEP_TAG, 0, 16) < 0:  # a relay batches StepReports only
                self._reject(
                    "malformed", "a node batch holds a message that is not a StepReport", source, n
                )
                return n
            payloads.append(payload)
            at += e.size
        if self._listeners:  # they take messages: decode each, as from a direct sender
            for payload in payloads:
                self._admit(payload, pub, source)
            return n
        self._take(batch, payloads, body, pub)
        return n

    def _relay_claim(self, source: zmq.Frame | None) -> tuple[str, schema.SenderClaim]:
        """(peer, claim) of a relay's message: the claims parsed once per connection's user
        name (a relay's beats and batches come several times a second from each node)."""
        peer, user = frame_origin(source)
        claim = self._claims.get(user)
        if claim is None:
            if len(self._claims) >= 16_384:
                self._claims.clear()
            claim = self._claims[user] = schema.SenderClaim.parse(user)
        return peer, claim

    def _take(
        self, batch: schema.NodeBatch, payloads: list[bytes], body: bytes, pub: zmq.Socket | None
    ) -> None:
        """Number, remember, record and publish a batch's reports (as _publish does one)."""
        first = self.seq + 1
        self.seq += len(payloads)
        self.accepted += len(payloads)
        self.reports += len(payloads)
        self.batches += 1
        note = self.snapshot.note_report
        remember = self._remember
        seq = first
        for e, payload in zip(batch.entries, payloads, strict=True):
            self.dropped_by_agents += e.dropped
            remember(payload)
            note(seq, e.rank, payload)
            seq += 1
        if self.trace is not None:
            try:
                self.trace.append_batch(batch, payloads)
            except Exception as exc:  # disk full...: keep serving live viewers
                self.stop_recording(exc)
        if pub is not None:
            sizes = proto.pack_sizes([e.size for e in batch.entries])
            pub.send_multipart([proto.update_header(self.instance, first), sizes, body])
