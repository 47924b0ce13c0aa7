"""The agent's ZeroMQ sender: it never blocks the training loop and counts what it drops.

A PUSH socket with ``IMMEDIATE`` (queue only on a live connection), a small send high-water mark
and ``NOBLOCK`` sends: when the collector is slow or gone, ``zmq.Again`` comes back at once, the
message is dropped and the drop count rides on the next StepReport/Heartbeat that gets through.
PUSH reconnects by itself (every ``RECONNECT_IVL``) when the collector comes back.

The Hello is *sticky*: it is re-sent first whenever the connection is (re)made, so a collector
restarted mid-run still learns who each rank is. Framing is ``[token, msgpack, ...]``: the token
(from ``ZEROSCOPE_TOKEN``; an empty frame when unset), then one or more messages. The agent's
sender hands over the reports of one wake-up as one multipart message (:meth:`send_batch`):
each ZeroMQ message wakes ZeroMQ's I/O thread, and on a 2-vCPU machine those wake-ups cost the
run more CPU than encoding the reports (the agent's overhead budget, agent/cost.py).

The connection itself is authenticated in the ZeroMQ handshake (PLAIN: the user name is a
:class:`~.schema.SenderClaim` saying which rank this is, the password the token). A collector
that refuses the token answers the handshake with an error, so this side *knows* it is refused
(``refused``) instead of sending into the void, and the collector knows whom it refused and
from which address. No message is ever queued on a refused connection (``IMMEDIATE``).

Until the first handshake succeeds, messages are *held* (at most ``EARLY_HOLD``, in order)
rather than dropped: a rank whose collector is slow to answer at start-up (a loaded machine,
another node's collector still starting) still delivers its first steps, after its Hello, once
the connection is made. Past the bound, or once the collector refused the handshake, messages
are dropped and counted as always; after the first connection nothing is held again.

No exception ever leaves this module: a failure is counted in ``errors`` and the message dropped.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

import zmq
from zmq.utils.monitor import parse_monitor_message

from .schema import Heartbeat, Hello, Message, SenderClaim, StepReport, encode

TOKEN_ENV = "ZEROSCOPE_TOKEN"
"""Per-job shared secret for non-loopback collectors (sent as the first frame)."""

SEND_HWM = 1000
"""Messages queued per connection before sends fail with EAGAIN (then they are dropped)."""

MAX_BATCH = 64
"""At most this many schema messages ride in one ZeroMQ message (a bounded frame list)."""

EARLY_HOLD = 256
"""Messages held before the first connection (a few MB at most on a ZeRO-3 report's size)."""

_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_LAST = int(zmq.NOBLOCK)
"""Send flags as plain ints: or-ing pyzmq's flag enums costs ~10 us of Python per send."""

CLOSE_LINGER_MS = 500
"""At close only: how long unsent messages (the Bye) may still go out. Bounded, so exit never
hangs; during the run the socket's linger is 0."""

NO_TOKEN = b"-"
"""The PLAIN password when no token is set (ZeroMQ refuses an empty one); a collector without
a token admits any password, one with a token refuses this."""

_WATCHED = (
    zmq.EVENT_CONNECTED
    | zmq.EVENT_DISCONNECTED
    | zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


def set_credentials(sock: zmq.Socket, token: bytes = b"", claim: SenderClaim | None = None) -> None:
    """Make ``sock`` (a PUSH to a collector, before ``connect``) present ``claim`` and the job
    token in the ZeroMQ handshake, as the collector's ingest requires of every sender."""
    sock.plain_username = (claim or SenderClaim()).username()
    sock.plain_password = token or NO_TOKEN


class Publisher:
    """Thread-safe, never-raising sender of schema messages to one collector address."""

    def __init__(
        self,
        address: str,
        token: bytes = b"",
        *,
        hwm: int = SEND_HWM,
        context: zmq.Context | None = None,
        claim: SenderClaim | None = None,
    ) -> None:
        self.address = address
        self._token = token
        self._lock = threading.Lock()
        self._monitor_lock = threading.Lock()
        """Held while the monitor socket is polled or closed. ZeroMQ sockets are not
        thread-safe: the sampler thread polls the monitor while the training thread's close (its
        sampler join timed out on a loaded machine) or wait_connected may use it too, and a
        socket closed under another thread's poll can leave ``Context.term()`` waiting forever,
        a rank that never exits after its last step."""
        self._own_context = context is None
        self._context = context if context is not None else zmq.Context()
        self._socket: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._sticky: bytes | None = None
        self._sticky_pending = False
        self._pending_drops = 0
        self._early: deque[list[bytes]] | None = deque()
        """Payload groups held until the first connection (None once it was made)."""
        self._early_count = 0
        self.sent = 0
        self.dropped = 0
        """Messages dropped in total (EAGAIN or errors)."""
        self.errors = 0
        """Unexpected exceptions caught (also counted in ``dropped``)."""
        self.closed = False
        self._pid = os.getpid()
        self.connected = False
        """Whether the last connection event seen was a successful handshake."""
        self.reached = False
        """Whether a TCP connection to the address was ever made (it answers)."""
        self.refused = ""
        """Why the collector refused the last handshake ("" when it did not), e.g. ``wrong
        token (handshake status 400)``. Cleared by a later successful handshake. (libzmq does
        not retry a connection refused for its credentials: they would not change.)"""
        try:
            sock = self._context.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, hwm)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.RECONNECT_IVL, 100)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
            set_credentials(sock, token, claim)
            self._monitor = sock.get_monitor_socket(_WATCHED)
            sock.connect(address)
            self._socket = sock
        except Exception:
            self.errors += 1

    # -- sending ---------------------------------------------------------------------------

    def set_sticky(self, hello: Hello) -> None:
        """Remember ``hello`` and send it now and after every reconnection."""
        try:
            data = encode(hello)
        except Exception:
            self.errors += 1
            return
        with self._lock:
            self._sticky = data
            self._sticky_pending = True
            self._flush_sticky_locked()

    def send(self, message: Message) -> bool:
        """Encode and send without blocking; False (and counted) when dropped."""
        return self.send_batch([message]) == 1

    def send_batch(self, messages: list[Message]) -> int:
        """Encode and send ``messages`` in order, as few ZeroMQ messages as possible (at most
        ``MAX_BATCH`` each), without blocking; returns how many went (the rest are counted as
        dropped). The drop count rides on the first StepReport or Heartbeat of the batch."""
        sent = 0
        for start in range(0, len(messages), MAX_BATCH):
            sent += self._send_chunk(messages[start : start + MAX_BATCH])
        return sent

    def _send_chunk(self, messages: list[Message]) -> int:
        try:
            with self._lock:
                carrier: StepReport | Heartbeat | None = None
                payloads = []
                for message in messages:
                    carries = carrier is None and isinstance(message, (StepReport, Heartbeat))
                    if carries:
                        message.dropped = self._pending_drops  # type: ignore[union-attr]
                    try:
                        payloads.append(encode(message))
                    except Exception:  # this message only: the rest of the batch still goes
                        self.errors += 1
                        self.dropped += 1
                        self._pending_drops += 1
                        continue
                    if carries:
                        carrier = message  # type: ignore[assignment]
                if not payloads:
                    return 0
                if self._early is not None and not (
                    self.refused or self.closed or os.getpid() != self._pid
                ):
                    return self._hold_locked(payloads, carrier)
                if self._flush_sticky_locked() and self._send_locked(*payloads):
                    if carrier is not None:
                        self._pending_drops -= carrier.dropped
                    return len(payloads)
                self._drop_locked(len(payloads))
                return 0
        except Exception:
            self.errors += 1
            self.dropped += len(messages)
            self._pending_drops += len(messages)
            return 0

    def _hold_locked(self, payloads: list[bytes], carrier: StepReport | Heartbeat | None) -> int:
        """Before the first connection: hold ``payloads`` behind those already held (dropped
        and counted past EARLY_HOLD), then try to send them all."""
        early = self._early
        assert early is not None
        if self._early_count + len(payloads) > EARLY_HOLD:
            self._drop_locked(len(payloads))
            self._flush_early_locked()
            return 0
        early.append(payloads)
        self._early_count += len(payloads)
        if carrier is not None:
            self._pending_drops -= carrier.dropped  # it rides along, sent later in order
        self._flush_early_locked()
        return len(payloads)

    def _flush_early_locked(self) -> None:
        """Send what was held before the first connection, after the Hello; once all of it
        went, the first connection is made and nothing is held any more. Refused: dropped."""
        early = self._early
        if early is None:
            return
        if self.refused or self.closed:
            self._early = None
            if self._early_count:
                self._drop_locked(self._early_count)
            return
        if not self._flush_sticky_locked():
            return
        while early:
            if not self._send_locked(*early[0]):
                return
            self._early_count -= len(early.popleft())
        self._early = None

    def count_dropped(self, n: int) -> None:
        """``n`` messages were lost before reaching this publisher (the agent's hand-off queue
        was full, agent/outbox.py): counted like its own drops, so the next report says so."""
        with self._lock:
            self.dropped += n
            self._pending_drops += n

    def poll_connection(self, timeout: float = 0.0) -> None:
        """Called from the sampler thread: notice disconnections (so the Hello is re-sent on
        reconnection) and retry a pending Hello. Never raises."""
        try:
            with self._monitor_lock:
                self._read_monitor_locked(timeout)
            with self._lock:
                if self._early is not None:
                    self._flush_early_locked()
                else:
                    self._flush_sticky_locked()
        except Exception:
            self.errors += 1

    def _read_monitor_locked(self, timeout: float) -> None:
        """The connection events waiting on the monitor, the first waited for ``timeout`` s
        (``_monitor_lock`` held: nothing else touches the monitor meanwhile)."""
        mon = self._monitor
        while mon is not None and not self.closed and mon.poll(int(timeout * 1000)):
            timeout = 0.0
            parsed = parse_monitor_message(mon.recv_multipart(zmq.NOBLOCK))
            event = parsed["event"]
            if event == zmq.EVENT_CONNECTED:
                self.reached = True
                continue
            with self._lock:
                self.connected = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
                if self.connected:
                    self.refused = ""
                elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    self.refused = f"wrong token (handshake status {parsed['value']})"
                elif event != zmq.EVENT_DISCONNECTED:
                    self.refused = "handshake failed (not a zeroscope collector?)"
                if not self.connected and self._sticky is not None:
                    self._sticky_pending = True  # re-announce on the next connection

    def wait_connected(self, timeout: float) -> bool:
        """Wait at most ``timeout`` s for the connection (start-up only, never in the loop),
        so the first reports of a fast job are not dropped while TCP is still handshaking.
        A refused handshake ends the wait at once: the training does not wait for a door that
        will not open."""
        deadline = time.monotonic() + timeout
        while not self.connected and not self.closed and not self.refused:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.poll_connection(min(left, 0.05))
        return self.connected

    def wait_live(self, timeout: float) -> bool:
        """Wait at most ``timeout`` s for a connection a message can go out on (end of run only,
        the sampler thread stopped). With ``IMMEDIATE`` the socket is writable exactly when one
        is up; ``connected`` alone can be stale: the events of a collector that died and came
        back while the process was held (SIGSTOP) may not have been read, or not yet made."""
        deadline = time.monotonic() + timeout
        while not self.closed and not self.refused:
            with self._lock:
                sock = self._socket
                live = sock is not None and bool(sock.poll(0, zmq.POLLOUT))
            if live:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.poll_connection(min(left, 0.05))
        return False

    @property
    def hello_pending(self) -> bool:
        return self._sticky_pending

    def _flush_sticky_locked(self) -> bool:
        if not self._sticky_pending or self._sticky is None:
            return True
        if self._send_locked(self._sticky):
            self._sticky_pending = False
            return True
        return False

    def _send_locked(self, *payloads: bytes) -> bool:
        sock = self._socket
        if sock is None or self.closed or os.getpid() != self._pid:
            return False  # a forked child (e.g. a DataLoader worker) must not touch the socket
        try:
            sock.send(self._token, _MORE)
        except zmq.Again:
            return False
        # Once the first frame is queued, ZeroMQ guarantees the rest of the multipart goes too.
        *first, last = payloads
        for data in first:
            sock.send(data, _MORE)
        sock.send(last, _LAST)
        self.sent += len(payloads)
        return True

    def _drop_locked(self, n: int = 1) -> None:
        self.dropped += n
        self._pending_drops += n
        if self._sticky is not None:
            # EAGAIN may mean the connection went away; re-announce when it comes back (a
            # duplicate Hello after mere back-pressure is harmless: the collector dedupes).
            self._sticky_pending = True

    # -- shutdown --------------------------------------------------------------------------

    def close(self, linger_ms: int = CLOSE_LINGER_MS) -> None:
        """Close the socket, giving queued messages at most ``linger_ms`` to leave. Waits for a
        monitor poll in progress on another thread (``_monitor_lock``, taken before ``_lock`` as
        ``poll_connection`` takes them)."""
        with self._monitor_lock, self._lock:
            if self.closed or os.getpid() != self._pid:
                return
            self.closed = True
            try:
                if self._socket is not None:
                    self._socket.disable_monitor()
                if self._monitor is not None:
                    self._monitor.close(linger=0)
                if self._socket is not None:
                    self._socket.close(linger=linger_ms)
                if self._own_context:
                    self._context.term()
            except Exception:
                self.errors += 1
