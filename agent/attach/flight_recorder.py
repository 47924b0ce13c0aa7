"""Collectives no Python wrapper can see, read from torch's own record of them: the Flight
Recorder (``torch._C._distributed_c10d._dump_fr_trace_json``).

DDP's bucket all-reduces run inside its C++ reducer, below every Python method the attach
wraps. Rather than replace the reducer's comm hook (which would change what the job runs),
the attach asks torch for the record it keeps anyway once ``TORCH_FR_BUFFER_SIZE`` is set
(:func:`configure_environment`, from the bootstrap, before the job creates its process
groups): every collective of every group, with its group, its per-group sequence number, its
name (``gloo:all_reduce``), its input and output sizes and dtypes.

What runs where:

- the training thread, per collective issued through a wrapped ``ProcessGroup`` method on a
  watched group: two reads of the group's sequence number around the call, so the entries that
  call made are *claimed* (they are already recorded, timed, by the wrappers); at a step end,
  one read per watched group: the step's last sequence number (the *mark*);
- the agent's sender thread: the dump (one per batch of reports), parsed, each entry of a
  watched group up to the step's mark and not claimed taken once, keyed by (group, sequence
  number).

Timing: on gloo an entry carries no completion time, so its clock is ``none`` (bytes and
counts exact; duration, busbw and exposed NA). Where torch measured a duration with CUDA events
(NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``: the entry's ``duration_ms``), that is the device
clock. Exposed time is never measured here. Entries the ring overwrote before a read are
counted in ``lost``, never guessed.

torch keeps two recorders, ProcessGroupNCCL's own (NCCL collectives, with CUDA events) and a
generic one (gloo): both are dumped (:data:`DUMPS`). The dump holds the interpreter lock while
torch builds it, and walks the whole ring each time:
the ring is kept small (:data:`DEFAULT_BUFFER`) and read only while a group is watched.

Draining often enough: the sender thread wakes about twice a second, and a ring of 64 holds
fewer entries than a job of short steps issues in that time (and one process-wide ring also
holds every other group's collectives: FSDP2's, a GradScaler's). So at each step end the
training thread compares the backlog (a watched group's sequence numbers issued since the last
take, scaled by the share of all entries its group issued in the last dump, from the entries'
process-wide ``record_id``) with half the ring: past it, the mark is *urgent* and the step's
hand-over wakes the sender at once (agent/outbox.py), so the dump comes before the ring turns
over. What no drain can save, a single step issuing more than the ring holds, is counted lost
and said with the ring size it would need.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from zeroscope.agent.collective_record import to_wire
from zeroscope.agent.schema import Collective, CollectiveOp

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
LEGACY_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
"""torch's older name for the ring size, read when ``TORCH_FR_BUFFER_SIZE`` is unset."""
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
FRESH_S = 0.05
"""How old a dump may be when a device duration not yet in it is asked for again (torch's
watchdog retires completed works every ~0.1 s)."""
DEFAULT_BUFFER = 64
"""Entries in torch's ring: more than the unseen collectives between two reads of a job with
one DDP model (a few buckets per step, a read per batch of reports), few enough that a dump,
which walks the whole ring, stays cheap (bench/attach_overhead.py: 256 entries cost DDP 6.5-10
ms of CPU per step on a loaded 2-core machine, 64 entries 0.3-2.7 ms)."""

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
}
"""The Flight Recorder's op names (after the backend's ``gloo:`` / ``nccl:``) as wire ops;
others (barrier, all-to-all, gather, scatter) have no wire op and are skipped."""

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


def configure_environment(env: Any = os.environ) -> None:
    """Turn torch's Flight Recorder on (and NCCL's per-collective timing) for process groups
    created from now on, unless the job set them itself (under either of torch's names)."""
    if BUFFER_ENV not in env and LEGACY_BUFFER_ENV not in env:
        env[BUFFER_ENV] = str(DEFAULT_BUFFER)
    env.setdefault(TIMING_ENV, "1")


def ring_size(env: Any = os.environ) -> int:
    """The ring's entries as torch reads them (0: the recorder is off)."""
    try:
        return max(0, int(env.get(BUFFER_ENV, env.get(LEGACY_BUFFER_ENV, "0")).strip() or 0))
    except ValueError:
        return 0


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


def collective_of(entry: dict[str, Any], group_size: int, label: str) -> Collective | None:
    """One Flight Recorder entry as the wire's Collective, ``start_s`` still the entry's wall
    clock in seconds (see :class:`RecorderOp`); None for an op the wire has no name for.
    Bytes follow nccl-tests (the gathered size for all-gather, the input for reduce-scatter)."""
    op = OPS.get(str(entry.get("profiling_name", "")).rpartition(":")[2])
    if op is None:
        return None
    if op == "all_gather":
        nbytes = _nbytes(entry["output_sizes"], entry["output_dtypes"])
    else:
        nbytes = _nbytes(entry["input_sizes"], entry["input_dtypes"])
    if nbytes is None:
        return None
    duration_ms = entry.get("duration_ms")
    timed = duration_ms is not None and entry.get("state") == "completed"
    return to_wire(
        op=op,
        nbytes=nbytes,
        group_size=group_size,
        start_s=entry.get("time_created_ns", 0) / 1e9,
        duration_s=float(duration_ms) / 1e3 if timed and duration_ms is not None else None,
        exposed_s=None,
        label=label,
        clock="device",
    )


class RecorderOp:
    """A collective read from the Flight Recorder, as the pending report resolves it (the
    interface of ``agent.comm.CollectiveRecord``): already complete."""

    __slots__ = ("_collective", "_issue_ns")

    cuda_events = None

    def __init__(self, collective: Collective, issue_ns: int) -> None:
        self._collective = collective
        self._issue_ns = issue_ns

    def resolve(self, step_start_ns: int, step_start_event: Any = None) -> Collective:
        c = self._collective
        c.start_s = (self._issue_ns - step_start_ns) / 1e9
        return c


class _Group:
    __slots__ = ("claimed", "label", "name", "size", "taken")

    def __init__(self, name: str, size: int, label: str) -> None:
        self.name = name
        self.size = size
        self.label = label
        self.taken = 0
        """The last sequence number handed out (or claimed) in this group."""
        self.claimed: set[int] = set()
        """Sequence numbers the wrappers recorded themselves (read on the sender thread by
        membership only: the training thread adds while the sender discards)."""


class RecorderMark:
    """A step end as the Flight Recorder reader needs it: each watched group's last sequence
    number then. Its :meth:`expand` (sender thread) is the step's unseen collectives.
    ``urgent``: the ring is half full of entries not yet read (wake the sender now)."""

    __slots__ = ("_reader", "marks", "urgent")

    def __init__(
        self, reader: FlightRecorderReader, marks: dict[str, int], urgent: bool = False
    ) -> None:
        self._reader = reader
        self.marks = marks
        self.urgent = urgent

    def expand(self) -> list[RecorderOp]:
        return self._reader.take(self.marks)


class FlightRecorderReader:
    """This process's reader (one per process, like the recorder it reads)."""

    def __init__(self, dump: Any = None) -> None:
        self.groups: dict[str, _Group] = {}
        self.lost = 0
        """Entries of a watched group the ring overwrote before a read took them."""
        self.errors = 0
        self.off_reason = ""
        """Why the reader turned itself off (empty while it works)."""
        self._dump = dump
        self._objects: dict[str, Any] = {}
        self._cache: list[dict[str, Any]] = []
        self._cache_top: dict[str, int] = {}
        self._dumped_at = 0.0
        self.ring = 0
        """The ring's entries (torch's, read when a group is first watched)."""
        self.share = 1.0
        """All entries per watched entry in the last dump (>= 1: other groups fill the ring
        too); written by the sender thread, read at step ends."""
        self.most_per_step = 0
        """The most watched entries (scaled by ``share``) one step issued: the ring a job
        needs at least, said if entries were lost."""

    def watch(self, group: Any, label: str) -> None:
        """Read ``group``'s unseen collectives from now on (a private call per step end: a
        failure turns the reader off and says why)."""
        if self.off_reason:
            return
        self.ring = ring_size()
        if not self.ring:
            self.turn_off(f"torch's Flight Recorder is off ({BUFFER_ENV} unset or 0)")
            return
        try:
            name = str(group.group_name)
            seq = int(group._get_sequence_number_for_group())
            if name not in self.groups:
                g = self.groups[name] = _Group(name, int(group.size()), label)
                g.taken = seq
                self._objects[name] = group
        except Exception as exc:
            self.turn_off(f"the group's sequence number is unreadable ({exc!r})")

    def turn_off(self, reason: str) -> None:
        """Stop reading (said once by the session: what is lost and why)."""
        self.off_reason = reason
        self.groups.clear()
        _say("collectives run below Python (DDP's reducer)", reason)

    def claim(self, group: Any, before: int) -> None:
        """Training thread, after a wrapped call on a watched group: the entries it made are
        the wrappers' own (see the module docstring)."""
        g = self.groups.get(group.group_name)
        if g is not None:
            g.claimed.update(range(before + 1, int(group._get_sequence_number_for_group()) + 1))

    def mark(self) -> RecorderMark | None:
        """At a step end (training thread): each watched group's last sequence number."""
        if not self.groups:
            return None
        try:
            marks = {
                name: int(self._objects[name]._get_sequence_number_for_group())
                for name in self.groups
            }
        except Exception as exc:
            self.turn_off(f"the group's sequence number is unreadable ({exc!r})")
            return None
        return RecorderMark(self, marks, self._urgent(marks))

    def _urgent(self, marks: dict[str, int]) -> bool:
        """Training thread: whether the unread entries fill half the ring (integers only)."""
        backlog = 0
        for name, top in marks.items():
            g = self.groups.get(name)
            if g is not None:
                backlog += max(0, top - g.taken)
        scaled = int(backlog * self.share)
        return 2 * scaled >= self.ring > 0

    def take(self, marks: dict[str, int]) -> list[RecorderOp]:
        """Sender thread: every entry of a watched group up to its mark not yet taken nor
        claimed by the wrappers, once."""
        out: list[RecorderOp] = []
        try:
            entries = self._entries(marks)
        except Exception as exc:
            self.errors += 1
            self.turn_off(f"the Flight Recorder dump failed ({exc!r})")
            return out
        offset = time.perf_counter_ns() - time.time_ns()
        lost_before = self.lost
        issued = sum(max(0, top - g.taken) for n, top in marks.items() if (g := self.groups.get(n)))
        self.most_per_step = max(self.most_per_step, int(issued * self.share))
        found: dict[str, set[int]] = {}
        for entry in entries:
            name = str(entry.get("process_group", [""])[0])
            g = self.groups.get(name)
            if g is None:
                continue
            seq = int(entry.get("collective_seq_id", 0))
            if not g.taken < seq <= marks.get(name, 0) or entry.get("is_p2p"):
                continue
            found.setdefault(name, set()).add(seq)
            if seq in g.claimed:
                continue
            c = collective_of(entry, g.size, g.label)
            if c is not None:
                out.append(RecorderOp(c, int(entry.get("time_created_ns", 0)) + offset))
        for name, top in marks.items():
            g = self.groups.get(name)
            if g is None or top <= g.taken:
                continue
            seen = found.get(name, set())
            for seq in range(g.taken + 1, top + 1):
                if seq not in seen and seq not in g.claimed:
                    self.lost += 1
                g.claimed.discard(seq)
            g.taken = top
        if self.lost and not lost_before:
            _say(
                "some collectives run below Python (DDP's reducer)",
                f"torch's Flight Recorder ring ({self.ring} entries) was overwritten before a "
                f"read; set {BUFFER_ENV} to at least {2 * max(self.most_per_step, 1)}",
            )
        out.sort(key=lambda op: op._issue_ns)
        return out

    def device_duration(self, name: str, seq: int, op: CollectiveOp) -> float | bool | None:
        """Sender thread: the device duration [s] torch measured for collective ``seq`` of
        group ``name`` (NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``: CUDA events on the NCCL
        stream, nothing held by zeroscope); False while its entry is not retired yet (ask
        again), None when it will not come (the ring dropped it, no timing, another op)."""
        try:
            entries = self._entries({name: seq}, fresh=True)
        except Exception as exc:
            self.errors += 1
            self.turn_off(f"the Flight Recorder dump failed ({exc!r})")
            return None
        for entry in entries:
            if str(entry.get("process_group", [""])[0]) != name:
                continue
            if int(entry.get("collective_seq_id", -1)) != seq:
                continue
            wire_op = OPS.get(str(entry.get("profiling_name", "")).rpartition(":")[2])
            if wire_op != op:
                return None  # not the op asked about: never another op's figure
            duration_ms = entry.get("duration_ms")
            if duration_ms is None or entry.get("state") != "completed":
                timed = os.environ.get(TIMING_ENV, "") == "1"
                return False if timed and entry.get("state") != "completed" else None
            return float(duration_ms) / 1e3
        return None  # overwritten before this read (or never recorded)

    def _entries(self, marks: dict[str, int], fresh: bool = False) -> list[dict[str, Any]]:
        """The recorder's entries, dumped again only when the last dump does not reach every
        mark (one dump serves the reports of a batch), or, ``fresh``, when it is older than
        :data:`FRESH_S` (an entry's duration appears once torch's watchdog retires it)."""
        stale = fresh and time.monotonic() - self._dumped_at > FRESH_S
        if stale or any(self._cache_top.get(n, -1) < top for n, top in marks.items()):
            self._dumped_at = time.monotonic()
            raw = (self._dump or _dump)()
            entries = (raw if isinstance(raw, dict) else json.loads(raw)).get("entries", [])
            top: dict[str, int] = {}
            for e in entries:
                name = str(e.get("process_group", [""])[0])
                top[name] = max(top.get(name, -1), int(e.get("collective_seq_id", 0)))
            self._cache, self._cache_top = entries, top
            self._learn_share(entries)
        return self._cache

    def _learn_share(self, entries: list[dict[str, Any]]) -> None:
        """All entries per watched entry in this dump (``record_id`` counts every group's)."""
        watched = sum(1 for e in entries if str(e.get("process_group", [""])[0]) in self.groups)
        if watched and len(entries) > 1:
            ids = [int(e.get("record_id", 0)) for e in entries]
            span = max(ids) - min(ids) + 1
            self.share = max(1.0, span / watched)


def _say(part: str, reason: str) -> None:
    """Once per part: what the reader lost and why (the session's console line and Log event)."""
    try:
        from .session import SESSION

        SESSION.lost(part, reason)
    except Exception:
        pass


DUMPS = ("_dump_nccl_trace_json", "_dump_fr_trace_json")
"""torch keeps two recorders: ProcessGroupNCCL's own (CUDA events: where NCCL collectives go,
absent from a CPU build) and the generic one (gloo). Both are read."""


def _dump() -> dict[str, Any]:
    import torch

    c10d: Any = torch._C._distributed_c10d
    found = [fn for name in DUMPS if (fn := getattr(c10d, name, None)) is not None]
    if not found:
        raise AttributeError(f"torch has none of {', '.join(DUMPS)}")
    entries: list[Any] = []
    for fn in found:
        entries += json.loads(bytes(fn(True, False))).get("entries", [])
    return {"entries": entries}


READER = FlightRecorderReader()
