"""Frames between the collector and its viewers (the zguide "Clone" pattern).

Every accepted message gets a sequence number (1, 2, ...) that is unique within one collector
*instance* (a random 8-byte id, new at each start, so a viewer notices a restarted collector).

- Updates, on the PUB socket: ``[instance + seq (16 bytes), payload]``, or, for the reports
  of a node relay's batch (collector/batch_ingest.py), ``[instance + seq, sizes, body]``: the
  payloads back to back in ``body``, their sizes little-endian u32 in ``sizes``
  (:func:`split_batch`), numbered ``seq, seq + 1, ...``: one ZeroMQ frame per report cost the
  collector ~4 us a report, a third of what the batch costs it otherwise.
- Catch-up, on the ROUTER socket: a viewer's DEALER sends ``[b"since", seq (8 bytes), token]``;
  the collector answers with ``[b"batch", instance, since, first_seq, payload, payload, ...]``
  messages (consecutive sequence numbers from ``first_seq``), then ``[b"end", instance, since,
  last_seq, pub_endpoint]``. ``since 0`` is the snapshot of everything so far; ``since`` is
  echoed so a viewer can ignore answers to requests it has superseded.
- A catch-up with more history than the collector's ``snapshot_bytes`` (a late viewer of a big
  job) is answered with the state instead (collector/snapshot.py): ``[b"state", instance,
  since, as_of, payload, ...]`` messages holding every Hello, the door's records, each rank's
  newest reports, heartbeat and bye and the newest events, in arrival order, then the ``end``.
  The viewer folds them all and continues from ``as_of``.

A viewer connects its SUB to ``pub_endpoint`` (learned from the first ``end``), applies updates
with ``seq == last + 1`` and asks ``since last`` again whenever it sees a gap, so no message is
lost between the snapshot and the subscription taking effect (ZeroMQ's slow-joiner problem).
"""

from __future__ import annotations

import struct

SINCE = b"since"
BATCH = b"batch"
END = b"end"
STATE = b"state"
ERROR = b"error"

_U64 = struct.Struct(">Q")


def pack_seq(seq: int) -> bytes:
    return _U64.pack(seq)


def unpack_seq(data: bytes) -> int:
    if len(data) != 8:
        raise ValueError(f"sequence frame of {len(data)} bytes, expected 8")
    return int(_U64.unpack(data)[0])


def update_header(instance: bytes, seq: int) -> bytes:
    return instance + _U64.pack(seq)


def split_update_header(header: bytes) -> tuple[bytes, int]:
    if len(header) != 16:
        raise ValueError(f"update header of {len(header)} bytes, expected 16")
    return header[:8], int(_U64.unpack(header[8:])[0])


def pack_sizes(sizes: list[int]) -> bytes:
    """The ``sizes`` frame of a batch update."""
    return struct.pack(f"<{len(sizes)}I", *sizes)


def split_batch(sizes: bytes, body: bytes) -> list[bytes]:
    """The payloads of a batch update; ValueError when the frames do not agree."""
    if len(sizes) % 4:
        raise ValueError(f"sizes frame of {len(sizes)} bytes, not a multiple of 4")
    lengths = struct.unpack(f"<{len(sizes) // 4}I", sizes)
    if sum(lengths) != len(body):
        raise ValueError("batch update sizes do not add up to its body")
    out = []
    at = 0
    for n in lengths:
        out.append(body[at : at + n])
        at += n
    return out


RELAY_BEAT = b"zeroscope-relay-beat"
"""First frame of a node relay's beat, ``[RELAY_BEAT, token]`` on the ingest socket (a rank's
messages start with the token instead): the relay is alive even while its node is quiet."""

NODE_BATCH = b"zeroscope-node-batch"
"""First frame of a node relay's batch of StepReports, ``[NODE_BATCH, token, header, body]``
on the ingest socket (agent/node_batch.py, collector/batch_ingest.py)."""
