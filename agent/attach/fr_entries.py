"""The Flight Recorder's entries, typed: torch's JSON dump decoded in one pass into the fields
the reader uses (torch's other fields are skipped by the decoder, never built), and one entry
as the wire's Collective (op name, bytes as nccl-tests count them, torch's own duration where
it measured one); the dump of both of torch's recorders, and one dump's entries indexed by group
(each entry visited once per dump: its cost is per ring entry). Kept apart from the reader
(flight_recorder.py), which decides when to dump and which entries belong to which step.
"""

from __future__ import annotations

from collections.abc import Container
from itertools import pairwise
from typing import Any

import msgspec

from zeroscope.agent.collective_record import to_wire
from zeroscope.agent.schema import Collective, CollectiveOp

OPS: dict[str, CollectiveOp] = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_gather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "send": "p2p",
    "recv": "p2p",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
"""The Flight Recorder's op names (after the backend's ``gloo:`` / ``nccl:``) as wire ops; an
op not named here has no wire op and is skipped."""

DTYPE_BYTES = {
    "Float": 4,
    "Double": 8,
    "Half": 2,
    "BFloat16": 2,
    "Long": 8,
    "Int": 4,
    "Short": 2,
    "Char": 1,
    "Byte": 1,
    "Bool": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2": 1,
}


class Entry(msgspec.Struct, gc=False):
    """One Flight Recorder entry: the fields the reader uses (torch's others are skipped by
    the decoder, never built)."""

    process_group: list[str] = msgspec.field(default_factory=list)
    collective_seq_id: int = 0
    record_id: int = 0
    profiling_name: str = ""
    input_sizes: list[list[int]] = msgspec.field(default_factory=list)
    input_dtypes: list[str] = msgspec.field(default_factory=list)
    output_sizes: list[list[int]] = msgspec.field(default_factory=list)
    output_dtypes: list[str] = msgspec.field(default_factory=list)
    time_created_ns: int = 0
    duration_ms: float | None = None
    state: str = ""
    is_p2p: bool = False

    @property
    def group(self) -> str:
        return self.process_group[0] if self.process_group else ""


class _Dump(msgspec.Struct):
    entries: list[Entry] = msgspec.field(default_factory=list)


_DECODER = msgspec.json.Decoder(_Dump, strict=False)


def entries_of(raw: bytes) -> list[Entry]:
    """A dump's entries. An entry torch shaped otherwise than :class:`Entry` expects (a field
    of another type in a later release) is left out, the others kept."""
    try:
        return _DECODER.decode(raw).entries
    except msgspec.ValidationError:
        out: list[Entry] = []
        for e in msgspec.json.decode(raw).get("entries", []):
            try:
                out.append(msgspec.convert(e, Entry, strict=False))
            except msgspec.ValidationError:
                continue
        return out


def _nbytes(sizes: list[list[int]], dtypes: list[str]) -> int | None:
    total = 0
    for shape, dtype in zip(sizes, dtypes, strict=False):
        size = DTYPE_BYTES.get(dtype)
        if size is None:
            return None
        n = 1
        for d in shape:
            n *= d
        total += n * size
    return total


def collective_of(entry: Entry | dict[str, Any], group_size: int, label: str) -> Collective | None:
    """One Flight Recorder entry as the wire's Collective, ``start_s`` still the entry's wall
    clock in seconds (see :class:`RecorderOp`); None for an op the wire has no name for.
    Bytes follow nccl-tests (the gathered size for all-gather, the input for reduce-scatter)."""
    if isinstance(entry, dict):
        entry = msgspec.convert(entry, Entry, strict=False)
    op = OPS.get(entry.profiling_name.rpartition(":")[2])
    if op is None:
        return None
    if op == "all_gather":
        nbytes = _nbytes(entry.output_sizes, entry.output_dtypes)
    elif op == "scatter":  # what each rank gets, times the group (nccl-tests' S)
        share = _nbytes(entry.output_sizes, entry.output_dtypes)
        nbytes = None if share is None else share * group_size
    elif op == "gather":  # what each rank sends, times the group
        share = _nbytes(entry.input_sizes, entry.input_dtypes)
        nbytes = None if share is None else share * group_size
    else:
        nbytes = _nbytes(entry.input_sizes, entry.input_dtypes)
    if nbytes is None:
        return None
    duration_ms = entry.duration_ms
    timed = duration_ms is not None and entry.state == "completed"
    return to_wire(
        op=op,
        nbytes=nbytes,
        group_size=group_size,
        start_s=entry.time_created_ns / 1e9,
        duration_s=float(duration_ms) / 1e3 if timed and duration_ms is not None else None,
        exposed_s=None,
        label=label,
        clock="device",
    )


NCCL_DUMP = "_dump_nccl_trace_json"
GENERIC_DUMP = "_dump_fr_trace_json"
DUMPS = (NCCL_DUMP, GENERIC_DUMP)
"""torch keeps two recorders: ProcessGroupNCCL's own (CUDA events: where NCCL collectives go,
absent from a CPU build) and the generic one (gloo). Both are read."""


def dumps_of(group: Any) -> set[str]:
    """The dumps that hold ``group``'s entries, from its backend as torch names it
    (``ProcessGroup.name()``: ``gloo``, ``nccl``, or ``cpu:gloo,cuda:nccl`` for a backend per
    device): NCCL's recorder for its collectives, the generic one for every other backend's (an
    unknown or unreadable name included). On a CUDA build both exist, so a missing generic dump
    must be said for a gloo group, never read as an empty ring: its entries would be counted
    lost and blamed on a late reader."""
    try:
        backend = str(group.name())
    except Exception:
        backend = ""
    parts = [part.rpartition(":")[2].strip() for part in backend.lower().split(",")]
    return {NCCL_DUMP if part == "nccl" else GENERIC_DUMP for part in parts}


def missing_dumps(needed: set[str]) -> list[str]:
    """Those of ``needed`` this torch lacks (a release that renamed them)."""
    import torch

    c10d: Any = torch._C._distributed_c10d
    return sorted(name for name in needed if getattr(c10d, name, None) is None)


def dump_all(needed: set[str] | frozenset[str] = frozenset()) -> list[list[Entry]]:
    """Each recorder torch has, dumped and decoded (one list of entries per recorder); raises
    when one of ``needed`` (the watched groups' dumps) or every dump is gone."""
    import torch

    c10d: Any = torch._C._distributed_c10d
    gone = missing_dumps(set(needed))
    if gone:
        raise AttributeError(f"torch has no {', '.join(gone)}")
    found = [fn for name in DUMPS if (fn := getattr(c10d, name, None)) is not None]
    if not found:
        raise AttributeError(f"torch has none of {', '.join(DUMPS)}")
    return [entries_of(bytes(fn(True, False))) for fn in found]


def index_by_group(
    parts: list[list[Entry]], watched: Container[str], timed: Container[str]
) -> tuple[dict[str, tuple[list[int], list[Entry]]], float | None]:
    """The entries of the ``watched`` and ``timed`` groups in one dump, each group's as (its
    sequence numbers ascending, its entries), and the dump's share: all entries per watched
    one, from the process-wide ``record_id`` of each recorder holding a watched entry (None
    when no ring held one: only such a ring can overwrite them)."""
    out: dict[str, tuple[list[int], list[Entry]]] = {}
    span = mine_all = 0
    for entries in parts:  # one recorder's entries each; record_id is per recorder
        low = high = -1
        mine = 0
        for e in entries:
            rid = e.record_id
            low = rid if low < 0 or rid < low else low
            high = max(high, rid)
            name = e.group
            if name in watched:
                mine += 1
            elif name not in timed:
                continue
            seqs, kept = out.setdefault(name, ([], []))
            seqs.append(e.collective_seq_id)
            kept.append(e)
        if mine:
            mine_all += mine
            span += high - low + 1
    for seqs, kept in out.values():  # ring order is issue order; sorted, to be sure
        if any(a >= b for a, b in pairwise(seqs)):
            pairs = sorted(zip(seqs, kept, strict=True), key=lambda p: p[0])
            seqs[:] = [q for q, _ in pairs]
            kept[:] = [k for _, k in pairs]
    share = max(1.0, span / mine_all) if mine_all and span > 1 else None
    return out, share
