"""A node relay's batch of StepReports: part of the wire, beside the messages of
:mod:`zeroscope.agent.schema` (which re-exports it: the viewer side imports only the schema).

At 16,384 ranks the collector's cost is per report: decode, validate, number, record, publish.
A node's relay has already decoded each of its ranks' reports (it is on the node, one of
thousands sharing the work), so it sends them to the collector as one ZeroMQ message of four
frames, ``[NODE_BATCH, token, header, body]``:

- ``body``: the reports' msgpack bytes, back to back: each as its rank sent it, with the
  summary the relay made of it (``StepReport.summary``, agent/schema_summary.py);
- ``header``: a :class:`NodeBatch`, msgpack: per report its indexed columns and size
  (:class:`BatchEntry`: rank, step, wall_ns, the sender's drop count, and the figures the
  trace's thinning judges a step by), and per (step, node) the node's aggregate
  (:class:`NodeStep`: what the cluster view and the trace's ``node_steps`` rows need of the
  node, folded once at the relay).

The collector numbers, records and publishes the reports from the header and slices of the
body, without decoding one of them; the trace and the viewers get these very bytes.
``version`` is :data:`NODE_BATCH_VERSION`; a collector refuses another (reason
``schema_version``), as it refuses a Hello of another wire version. It stands alone like the
schema: msgspec and nothing of the project.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

NODE_BATCH_VERSION = 1
"""Bumped on any incompatible change of the batch's header."""

_Rank = Annotated[int, msgspec.Meta(ge=0, lt=1 << 24)]
_Step = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]
_Instant = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=(1 << 63) - 1)]


class BatchEntry(msgspec.Struct, array_like=True, gc=False):
    """One rank's StepReport in the batch: where its bytes are and what the collector needs of
    it without decoding it (the same checks :func:`zeroscope.agent.schema.decode` applies to
    the report's rank, step and instant)."""

    rank: _Rank
    step: _Step
    wall_ns: _Instant
    size: Annotated[int, msgspec.Meta(ge=1)]
    """Bytes of its msgpack in the body, which holds the reports in the header's order."""
    dropped: _Count
    """The report's ``dropped`` (the rank's sender's back-pressure count)."""
    node_rank: int
    """The node its Hello names (the relay's own when the Hello has not come by)."""
    duration_s: float
    exposed_s: float
    """Sum of its collectives' ``exposed_s``: the straggler judgement's compute is
    ``duration_s - exposed_s``."""
    alerted: bool
    """The report had an overflow or a skipped step (the trace keeps such steps)."""


class NodeStep(msgspec.Struct, array_like=True, gc=False):
    """One node's ranks in one step, folded at the relay (zeroscope.state.node_steps: the one
    definition, the same the trace's ``node_steps`` rows hold). A batch carries what its own
    reports make; two batches of one (step, node) merge (counts and sums add, extremes take
    the extreme), so a rank that reports late still counts."""

    step: _Step
    node_rank: int
    ranks: int
    """Reports folded in."""
    step_s_min: float
    step_s_sum: float
    """Sum of their step times (the mean is ``step_s_sum / ranks``)."""
    step_s_max: float
    slowest_rank: int
    """The rank with ``step_s_max`` (the lowest such rank)."""
    wall_ns_max: int
    memory_max: int
    """The largest P+G+O+A of its ranks [bytes] (parts not reported count 0)."""
    memory_min: int
    exposed_s_max: float
    """The largest sum of exposed collective time of its ranks [s]."""
    comm_bytes: int
    """Collective bytes (``nbytes``) of every report."""
    samples: int
    alerted: bool


class NodeBatch(msgspec.Struct, kw_only=True):
    """The header frame of a node relay's batch (see the module doc)."""

    version: int
    node_rank: int
    """The relay's node (its ``--node-rank``)."""
    hostname: str
    entries: list[BatchEntry]
    nodes: list[NodeStep]
    """One per (step, node) of the entries."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(NodeBatch)


def encode_batch(batch: NodeBatch) -> bytes:
    return _encoder.encode(batch)


class BatchError(ValueError):
    """A header that cannot be accepted; ``str()`` is one line, ``reason`` the collector's
    counter (``"malformed"`` or ``"schema_version"``, as for a message)."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


def decode_batch(data: bytes) -> NodeBatch:
    """The header, validated, or :class:`BatchError`."""
    try:
        batch = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BatchError(f"malformed node batch: {(str(exc) or 'empty').splitlines()[0]}") from None
    except Exception as exc:  # odd bytes never crash the collector
        raise BatchError(f"malformed node batch: {type(exc).__name__}") from None
    if batch.version != NODE_BATCH_VERSION:
        raise BatchError(
            f"unsupported node batch version {batch.version} "
            f"(this zeroscope speaks {NODE_BATCH_VERSION})",
            "schema_version",
        )
    return batch
