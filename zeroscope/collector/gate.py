"""The collector's door: who may send, who was turned away, and from where.

Every sender authenticates in the ZeroMQ handshake (PLAIN: the user name is the sender's claim of
who it is, :class:`~zeroscope.agent.schema.SenderClaim`; the password is the job token). This
module answers those handshakes as the ZAP handler (ZeroMQ RFC 27) of the collector's context.
Why in the handshake and not only per message: a refused sender gets an error back at once (its
node says so, agent/publish.py) instead of sending into the void, and the collector learns the
refused sender's claimed rank and IP address, which a message dropped after the fact cannot say.

What is turned away (refused handshakes; messages rejected as malformed, oversize, another schema
version...) and what is admitted but never reports is counted per (reason, peer, claim) and
handed to the collector as :class:`~zeroscope.agent.schema.Admission` records with running
totals, at most one per second per sender. The collector numbers, records and serves them like
any message: that is how a rank that never reports is named, with the reason, live, in
``summary`` and in replay.
"""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from zeroscope.agent.schema import Admission, SenderClaim

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
"""Where libzmq asks for authentication (fixed by RFC 27; one handler per context)."""

DOMAIN = b"zeroscope"

EMIT_INTERVAL_S = 1.0
"""At most one record per sender and reason this often (a refused rank retries every second)."""

QUIET_ADMITTED_S = 10.0
"""A rank admitted this long ago without a Hello gets a record (it connects, sends nothing
valid). Ranks that report are never recorded, so a healthy job's trace holds no such rows."""

MAX_RECORDS = 1024
"""Records handed out per call at most (4 calls a second): a whole misconfigured node group
is said within a second, a flood of made-up senders cannot swamp the trace."""

MAX_SENDERS = 4096
"""Distinct senders tracked; past it, new ones are counted under one anonymous entry, so memory
stays bounded whatever a stranger on the network sends."""

HANDSHAKE_FAILURES = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
"""Ingest-socket monitor events of senders that do not speak PLAIN (no address is given)."""


@dataclass(slots=True)
class _Sender:
    reason: str
    unit: str
    peer: str
    claim: SenderClaim
    first_s: float
    count: int = 0
    emitted: int = 0
    last_emit_s: float = -math.inf
    detail: str = ""

    def record(self) -> Admission:
        c = self.claim
        return Admission(
            wall_ns=time.time_ns(),
            reason=self.reason,
            count=self.count,
            unit=self.unit,
            peer=self.peer,
            rank=c.rank,
            node_rank=c.node_rank,
            world_size=c.world_size,
            hostname=c.hostname,
            role=c.role,
            detail=self.detail,
        )


def frame_origin(frame: zmq.Frame | None) -> tuple[str, bytes]:
    """(peer IP, handshake user name) of a received frame; empty when ZeroMQ cannot say."""
    if frame is None:
        return "", b""
    try:
        peer = frame.get("Peer-Address")
    except zmq.ZMQError:
        peer = ""
    try:
        user = str(frame.get("User-Id")).encode()
    except (zmq.ZMQError, UnicodeError):
        user = b""
    return str(peer), user


class Gate:
    """Answers handshakes for one collector and keeps what it turned away (see module doc)."""

    def __init__(self, token: bytes) -> None:
        self.token = token
        self.refused: dict[str, int] = {}
        """Connections refused, by reason (``unauthenticated``, ``handshake``)."""
        self._senders: dict[tuple[str, str, bytes], _Sender] = {}

    # -- sockets ---------------------------------------------------------------------------

    def open(self, ctx: zmq.Context) -> zmq.Socket:
        """The ZAP handler's socket: bind it before the ingest socket, whose every handshake
        asks it (PLAIN without a handler fails)."""
        zap = ctx.socket(zmq.ROUTER)
        zap.setsockopt(zmq.LINGER, 0)
        zap.bind(ZAP_ENDPOINT)
        return zap

    @staticmethod
    def guard(sock: zmq.Socket) -> None:
        """Make ``sock`` (the ingest PULL, before bind) a PLAIN server checked by this gate."""
        sock.plain_server = True
        sock.zap_domain = DOMAIN

    def answer(self, zap: zmq.Socket) -> None:
        """Answer every pending handshake: 200 with the right token (or when the collector has
        none), 400 otherwise. The admitted connection's user id is its claim, so each message
        rejected later still says which rank sent it."""
        for _ in range(1000):
            try:
                frames = zap.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 8:
                continue  # not a ZAP request (nothing else connects to this endpoint)
            # [routing id, "", version, request id, domain, address, identity, mechanism, creds]
            ident, _, _version, request_id, _domain, address, _identity, mechanism = frames[:8]
            creds = frames[8:]
            user, password = (creds[0], creds[1]) if len(creds) == 2 else (b"", b"")
            ok = mechanism == b"PLAIN" and (
                not self.token or hmac.compare_digest(password, self.token)
            )
            peer = address.decode(errors="replace")
            if ok:
                self.note("admitted", peer, user, unit="connection")
                reply = [b"200", b"OK", user]
            else:
                self.refused["unauthenticated"] = self.refused.get("unauthenticated", 0) + 1
                self.note("unauthenticated", peer, user, "wrong or missing token", "connection")
                reply = [b"400", b"wrong or missing token", b""]
            zap.send_multipart([ident, b"", b"1.0", request_id, *reply, b""])

    def handshake_failed(self, detail: str) -> None:
        """A sender that does not speak PLAIN (an older zeroscope, a port scanner): ZeroMQ
        gives no address for it, so it is counted anonymously."""
        self.refused["handshake"] = self.refused.get("handshake", 0) + 1
        self.note("handshake", "", b"", detail, "connection")

    # -- bookkeeping -----------------------------------------------------------------------

    def note(
        self, reason: str, peer: str, user: bytes, detail: str = "", unit: str = "message"
    ) -> None:
        """Count one thing turned away (or one admitted connection) from ``peer``/``user``."""
        key = (reason, peer, user)
        sender = self._senders.get(key)
        if sender is None:
            if len(self._senders) >= MAX_SENDERS:
                key = (reason, "", b"")
                sender = self._senders.get(key)
                user, peer = b"", ""
            if sender is None:
                sender = self._senders[key] = _Sender(
                    reason, unit, peer, SenderClaim.parse(user), time.monotonic()
                )
        sender.count += 1
        if detail:
            sender.detail = detail[:300]

    def due(self, reported: Callable[[int], bool], *, final: bool = False) -> list[Admission]:
        """Records whose totals moved since last said (rate-limited unless ``final``). A node's
        admitted launcher is said at once; an admitted rank only while it has not reported
        (``reported(rank)`` false) and has been quiet for QUIET_ADMITTED_S (or at the end); an
        admitted sender that claims no rank never (it has nothing to be missing as)."""
        now = time.monotonic()
        out: list[Admission] = []
        for s in self._senders.values():
            if len(out) >= MAX_RECORDS and not final:
                break  # the rest stay due for the next call
            if s.count == s.emitted or (not final and now - s.last_emit_s < EMIT_INTERVAL_S):
                continue
            if s.reason == "admitted" and s.claim.role != "launcher":
                rank = s.claim.rank
                if rank < 0 or reported(rank) or (not final and now - s.first_s < QUIET_ADMITTED_S):
                    continue
            s.emitted, s.last_emit_s = s.count, now
            out.append(s.record())
        return out
