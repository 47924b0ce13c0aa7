"""The collector's viewer side: the history it keeps for late joiners, and the catch-up it
sends a viewer that asks (``[since, seq, token]`` on the ROUTER, :mod:`.protocol`): the
messages after ``since``, or, past ``snapshot_bytes`` of them, the state instead
(:mod:`.snapshot`). A mixin of :class:`zeroscope.collector.server.Collector`, which owns the
attributes named below and calls these on its one thread."""

from __future__ import annotations

import hmac

import zmq

from zeroscope.agent import schema
from zeroscope.collector import protocol as proto
from zeroscope.collector.snapshot import Snapshot

BATCH = 2000
"""Messages per catch-up frame."""


class ViewerService:
    """History kept for viewers, and their catch-ups (see the module docstring)."""

    token: bytes
    instance: bytes
    seq: int
    pub_address: str
    history_bytes: int
    snapshot: Snapshot
    snapshot_bytes: int
    _history: list[bytes]
    _history_base: int
    _history_size: int
    _hellos: dict[tuple[str, int], tuple[int, bytes, schema.Hello]]
    _admissions: dict[tuple[str, str, int, int, str], tuple[int, bytes]]

    def _remember(self, payload: bytes) -> None:
        self._history.append(payload)
        self._history_size += len(payload)
        if self._history_size > self.history_bytes and len(self._history) > 1:
            cut = len(self._history) // 2
            self._history_size -= sum(len(p) for p in self._history[:cut])
            del self._history[:cut]
            self._history_base += cut

    def _serve_viewers(self, router: zmq.Socket) -> None:
        for _ in range(100):
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ident, body = frames[0], frames[1:]
            try:
                if len(body) < 2 or body[0] != proto.SINCE:
                    raise ValueError("expected [since, seq, token]")
                since = proto.unpack_seq(body[1])
                token = body[2] if len(body) > 2 else b""
                if self.token and not hmac.compare_digest(token, self.token):
                    raise ValueError("wrong or missing token")
            except ValueError as exc:
                router.send_multipart([ident, proto.ERROR, str(exc).encode()])
                continue
            self._send_since(router, ident, since)

    def _send_since(self, router: zmq.Socket, ident: bytes, since: int) -> None:
        base = self._history_base
        echo = proto.pack_seq(since)
        if since <= base:
            history = self._history_size
        else:
            history = sum(len(p) for p in self._history[since - base :])
        if history > self.snapshot_bytes:
            self._send_state(router, ident, since)
            return
        if since < base:
            # Trimmed history: the viewer still needs every rank's Hello first (and what the
            # door turned away, which names the ranks that never came).
            kept = [(seq, payload) for seq, payload, _ in self._hellos.values()]
            for seq, payload in sorted([*kept, *self._admissions.values()]):
                if seq > since and seq <= base:
                    router.send_multipart(
                        [ident, proto.BATCH, self.instance, echo, proto.pack_seq(seq), payload]
                    )
            since = base
        start = since - base
        for i in range(start, len(self._history), BATCH):
            chunk = self._history[i : i + BATCH]
            router.send_multipart(
                [ident, proto.BATCH, self.instance, echo, proto.pack_seq(base + i + 1), *chunk]
            )
        router.send_multipart(
            [
                ident,
                proto.END,
                self.instance,
                echo,
                proto.pack_seq(self.seq),
                self.pub_address.encode(),
            ]
        )

    def _send_state(self, router: zmq.Socket, ident: bytes, since: int) -> None:
        """The state instead of the history (collector/snapshot.py), ending at the current seq."""
        kept = [(seq, payload) for seq, payload, _ in self._hellos.values()]
        items = self.snapshot.items(since, [*kept, *self._admissions.values()])
        echo, as_of = proto.pack_seq(since), proto.pack_seq(self.seq)
        head = [ident, proto.STATE, self.instance, echo, as_of]
        for i in range(0, len(items), BATCH):
            router.send_multipart([*head, *(p for _, p in items[i : i + BATCH])])
        if not items:
            router.send_multipart(head)
        router.send_multipart(
            [ident, proto.END, self.instance, echo, as_of, self.pub_address.encode()]
        )
