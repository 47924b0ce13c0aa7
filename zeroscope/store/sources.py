"""Where a viewer's messages come from, behind one interface: a live collector or a trace file.

The TUI, the headless printer and tests all consume a :class:`Source`: ``poll(timeout)`` returns
the next messages in order (possibly none), ``close()`` releases it. Consumers feed them to
``ClusterState.apply`` one by one.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import zmq

from zeroscope.agent import schema
from zeroscope.agent.schema import Message
from zeroscope.collector import protocol as proto
from zeroscope.store.trace import TraceReader

RESYNC_INTERVAL = 1.0
"""A live source with nothing new asks the collector for anything it missed this often (cheap:
an empty answer). It also notices a restarted collector this way."""

REQUEST_TIMEOUT = 3.0
"""An unanswered catch-up request is sent again after this long (the collector may be down)."""


class Source(Protocol):
    def poll(self, timeout: float) -> list[Message]: ...

    def close(self) -> None: ...


class LiveSource:
    """Snapshot then live updates from a collector's viewer address; survives restarts.

    The Clone pattern (zguide ch. 5) with gap repair: see :mod:`zeroscope.collector.protocol`.
    """

    def __init__(
        self, viewer_address: str, token: bytes = b"", pub_address: str | None = None
    ) -> None:
        """``pub_address`` overrides the PUB endpoint the collector announces (which is as seen
        on its own host): e.g. the local end of an ``ssh -L`` tunnel."""
        self.viewer_address = viewer_address
        self._pub_override = pub_address
        self._token = token
        self._ctx = zmq.Context()
        self._dealer = self._ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.connect(viewer_address)
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.setsockopt(zmq.RCVHWM, 100_000)
        self._pub_address = ""
        self._poller = zmq.Poller()
        self._poller.register(self._dealer, zmq.POLLIN)
        self._poller.register(self._sub, zmq.POLLIN)
        self.instance: bytes | None = None
        self.last_seq = 0
        self.restarts = 0
        """Times a different collector instance answered (messages were re-sent from seq 1)."""
        self.error = ""
        self.snapshots = 0
        """State frames received (a big job's catch-up: the state, not the history)."""
        self._buffer: dict[int, bytes] = {}
        self._state_as_of = -1
        """The ``as_of`` of the state snapshot being received (its frames share it)."""
        self._inflight_since = 0.0
        self._expect_since = 0
        self._last_activity = time.monotonic()
        self._request()

    @property
    def caught_up(self) -> bool:
        """The collector's answer to the latest catch-up request has ended (its snapshot, in
        however many frames, has all arrived): what follows is live."""
        return self.instance is not None and not self._inflight_since

    def _request(self) -> None:
        self._expect_since = self.last_seq
        self._dealer.send_multipart([proto.SINCE, proto.pack_seq(self.last_seq), self._token])
        self._inflight_since = time.monotonic()

    def _emit(self, payload: bytes, out: list[Message]) -> None:
        try:
            out.append(schema.decode(payload))
        except schema.SchemaError as exc:  # the collector validated it; a bug if seen
            self.error = str(exc)

    def _on_reply(self, frames: list[bytes], out: list[Message]) -> None:
        kind = frames[0]
        if kind == proto.ERROR:
            self.error = frames[1].decode(errors="replace") if len(frames) > 1 else "error"
            self._inflight_since = 0.0
            return
        if len(frames) < 4 or proto.unpack_seq(frames[2]) != self._expect_since:
            return  # the answer to an older request
        instance, seq = frames[1], proto.unpack_seq(frames[3])
        if self.instance is None:
            self.instance = instance
        elif instance != self.instance:
            # A restarted collector numbers from 1 again: take its whole history.
            self.restarts += 1
            self.instance = instance
            self.last_seq = 0
            self._buffer.clear()
            self._request()
            return
        if kind == proto.STATE:
            # The collector's state instead of its history: fold it all, continue from as_of.
            if seq > self.last_seq or seq == self._state_as_of:
                for payload in frames[4:]:
                    self._emit(payload, out)
                self.last_seq = self._state_as_of = seq
                self.snapshots += 1
        elif kind == proto.BATCH:
            for i, payload in enumerate(frames[4:]):
                if seq + i > self.last_seq:
                    self._emit(payload, out)
                    self.last_seq = seq + i
        elif kind == proto.END:
            self._inflight_since = 0.0
            pub = self._pub_override or frames[4].decode()
            if pub != self._pub_address:
                if self._pub_address:
                    self._sub.disconnect(self._pub_address)
                self._sub.connect(pub)
                self._pub_address = pub
            self._drain_buffer(out)

    def _drain_buffer(self, out: list[Message]) -> None:
        while self.last_seq + 1 in self._buffer:
            self.last_seq += 1
            self._emit(self._buffer.pop(self.last_seq), out)
        for s in [s for s in self._buffer if s <= self.last_seq]:
            del self._buffer[s]
        if self._buffer and not self._inflight_since:
            self._request()  # a gap: ask for what is missing

    def _on_update(self, frames: list[bytes], out: list[Message]) -> None:
        if len(frames) not in (2, 3):
            return
        instance, seq = proto.split_update_header(frames[0])
        if instance != self.instance:
            if not self._inflight_since:
                self._request()  # a new collector: resynchronize through the ROUTER
            return
        try:  # a node batch's reports: consecutive numbers from seq
            payloads = [frames[1]] if len(frames) == 2 else proto.split_batch(*frames[1:])
        except ValueError:
            return  # the gap it leaves is asked for again
        for i, payload in enumerate(payloads):
            if seq + i > self.last_seq:
                self._buffer[seq + i] = payload
        if not self._inflight_since:
            self._drain_buffer(out)

    def poll(self, timeout: float) -> list[Message]:
        out: list[Message] = []
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            events = dict(self._poller.poll(int(left * 1000) if not out else 0))
            if self._dealer in events:
                while True:
                    try:
                        self._on_reply(self._dealer.recv_multipart(zmq.NOBLOCK), out)
                    except zmq.Again:
                        break
            if self._sub in events:
                for _ in range(10_000):
                    try:
                        self._on_update(self._sub.recv_multipart(zmq.NOBLOCK), out)
                    except zmq.Again:
                        break
            now = time.monotonic()
            if out:
                self._last_activity = now
            if self._inflight_since and now - self._inflight_since > REQUEST_TIMEOUT:
                self._request()
            elif not self._inflight_since and now - self._last_activity > RESYNC_INTERVAL:
                self._last_activity = now
                self._request()
            if out or now >= deadline:
                return out

    def close(self) -> None:
        self._dealer.close(linger=0)
        self._sub.close(linger=0)
        self._ctx.term()


class TraceSource:
    """Replay of a trace file, one step at a time: ``poll`` returns the Hellos first, then each
    step's messages in turn, then ``[]`` at the end. Pacing (speed, pause) is the viewer's."""

    def __init__(self, path: str | Path) -> None:
        self.reader = TraceReader(path)
        steps = self.reader.steps()
        self.first_step, self.last_step = steps if steps is not None else (0, -1)
        self._hellos_sent = False
        self.next_step = self.first_step

    def hellos(self) -> list[schema.Hello]:
        return self.reader.hellos()

    def preamble(self) -> list[Message]:
        """What comes before the steps: the Hellos, then the collector's Admission records
        (which name the ranks that never reported)."""
        return [*self.reader.hellos(), *self.reader.admissions()]

    def step_messages(self, step: int) -> list[Message]:
        """Every message recorded for ``step`` (all ranks), in arrival order."""
        return list(self.reader.messages(from_step=step, to_step=step))

    def messages_until(self, step: int) -> Iterator[Message]:
        """Hellos, then every message of steps up to and including ``step`` (to rebuild state
        after a seek), streamed: the trace is never loaded whole."""
        yield from self.preamble()
        yield from self.reader.messages(to_step=step)

    def seek(self, step: int) -> None:
        """Make ``poll`` continue at ``step`` (clamped to the recorded range)."""
        self.next_step = min(max(step, self.first_step), self.last_step + 1)

    @property
    def at_end(self) -> bool:
        return self.next_step > self.last_step

    def poll(self, timeout: float = 0.0) -> list[Message]:
        if not self._hellos_sent:
            self._hellos_sent = True
            return self.preamble()
        while not self.at_end:
            step = self.next_step
            self.next_step += 1
            msgs = self.step_messages(step)
            if msgs:
                return msgs
        if timeout > 0:
            time.sleep(min(timeout, 0.05))
        return []

    def close(self) -> None:
        self.reader.close()
