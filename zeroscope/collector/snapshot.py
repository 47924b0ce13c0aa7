"""What a late viewer gets first from a big job: the state, not the history.

A viewer that connects (``zeroscope attach``, a second TUI) asks for everything since seq 0.
The collector answered with every message it still held, up to 256 MB: at 16,384 ranks that is
the last few steps of a hundred thousand reports, ~16 MB a step, every one decoded and folded
before the first frame. What the cluster view needs is each rank's newest reports, not all of
them. So the collector keeps, beside its history:

- each rank's last ``steps`` StepReports (two by default: the newest step may still be
  arriving, the one before is whole), its newest Heartbeat and its Bye;
- the last ``EVENTS`` Events (loss-scale changes, overflows: the alerts' evidence);
- (in the server) every Hello and the newest record per sender of its door.

A catch-up whose history would exceed ``snapshot_bytes`` gets these instead, in arrival
order, as ``state`` frames (collector/protocol.py) that end at the collector's current seq: the
viewer then continues with live updates. The snapshot's size depends on the ranks, never on how
long the job has run. A smaller catch-up (a small job, a viewer repairing a gap) is the
history, as before.
"""

from __future__ import annotations

from collections import deque

from zeroscope.agent import schema
from zeroscope.agent.schema import Message

SNAPSHOT_STEPS = 2
"""StepReports per rank a state snapshot carries."""

SNAPSHOT_BYTES = 32 * 1024 * 1024
"""A catch-up with more history than this gets the state instead."""

EVENTS = 4096
"""Events a state snapshot carries at most (the newest)."""


class Snapshot:
    """Each rank's newest messages, noted as the collector publishes them."""

    def __init__(self, steps: int = SNAPSHOT_STEPS) -> None:
        self.steps = steps
        self._reports: dict[int, deque[tuple[int, bytes]]] = {}
        self._beats: dict[int, tuple[int, bytes]] = {}
        self._byes: dict[int, tuple[int, bytes]] = {}
        self._events: deque[tuple[int, bytes]] = deque(maxlen=EVENTS)

    def note(self, seq: int, message: Message, payload: bytes) -> None:
        if isinstance(message, schema.StepReport):
            self.note_report(seq, message.rank, payload)
        elif isinstance(message, schema.Heartbeat):
            self._beats[message.rank] = (seq, payload)
        elif isinstance(message, schema.Event):
            self._events.append((seq, payload))
        elif isinstance(message, schema.Bye):
            self._byes[message.rank] = (seq, payload)

    def note_report(self, seq: int, rank: int, payload: bytes) -> None:
        """A StepReport of ``rank`` (a node relay's batch is noted without decoding it)."""
        ring = self._reports.get(rank)
        if ring is None:
            ring = self._reports[rank] = deque(maxlen=self.steps)
        ring.append((seq, payload))

    def items(self, since: int, kept: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """Every message of the state newer than ``since``, with ``kept`` (the Hellos and the
        door's records), in arrival order."""
        out = [item for item in kept if item[0] > since]
        for ring in self._reports.values():
            out += [item for item in ring if item[0] > since]
        for held in (self._beats, self._byes):
            out += [item for item in held.values() if item[0] > since]
        out += [item for item in self._events if item[0] > since]
        out.sort(key=lambda item: item[0])
        return out
