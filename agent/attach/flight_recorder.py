"""Collectives no Python wrapper can see, read from torch's own record of them: the Flight
Recorder (``torch._C._distributed_c10d._dump_fr_trace_json``).

DDP's bucket all-reduces run inside its C++ reducer, below every Python method the attach
wraps. Rather than replace the reducer's comm hook (which would change what the job runs),
the attach reads the record torch keeps anyway (torch 2.13 records every collective by
default, in a ring of 2,000 entries; :func:`configure_environment`, from the bootstrap before
the job creates its process groups, makes the ring 128 entries unless the job sized it, since
a dump walks the whole ring: docs/engines/timing.md says what that changes): every collective
of every group, with its group, its per-group sequence number, its
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
generic one (gloo): both are dumped (:data:`.fr_entries.DUMPS`), each decoded, and their entries read as one.
A dump holds the interpreter lock while torch builds it, and walks the whole ring each time:
its cost is per entry in the ring (measured on this project's 2-core VM, torch 2.13, gloo: ~15
us of CPU per entry for torch's JSON, ~5 more to decode it in Python), so what the reader costs
a job is how many times each entry is dumped. It is decoded straight into typed structs
(msgspec, fields the reader uses only) in one pass.

Draining often enough, and no more: the sender thread wakes about twice a second, and a ring
holds fewer entries than a job of short steps issues in that time (and one process-wide ring
also holds every other group's collectives: FSDP2's, a GradScaler's). So at each step end the
training thread compares the backlog (a watched group's sequence numbers issued since the last
take, scaled by the share of all entries its group issued in the last dump, from the entries'
process-wide ``record_id``) with the ring less a headroom: the larger of a quarter of the ring
and two of the second largest of the last steps (scaled alike; one burst, an evaluation's, does
not size it), so that a sender one step late still reads before the ring turns over. Past it,
the mark is *urgent* and the step's hand-over wakes the sender at once (agent/outbox.py). Each entry is then dumped about ring / (ring - headroom)
times: 1.33 for a job of few collectives per step, where the former half-ring threshold dumped
each twice. What no drain can save, a single step issuing more than the ring holds, is counted
lost and said with the ring size it would need.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left, bisect_right
from collections import deque
from typing import Any

from zeroscope.agent.schema import Collective, CollectiveOp

from .fr_entries import (
    OPS,
    Entry,
    collective_of,
    dump_all,
    dumps_of,
    entries_of,
    index_by_group,
    missing_dumps,
)

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
LEGACY_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
"""torch's older name for the ring size, read when ``TORCH_FR_BUFFER_SIZE`` is unset."""
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"
FRESH_S = 0.05
"""How old a dump may be when a device duration not yet in it is asked for again (torch's
watchdog retires completed works every ~0.1 s)."""
DEFAULT_BUFFER = 128
"""Entries in torch's ring. Each dump walks the whole ring (under the interpreter lock, ~2-4 ms
at 128 entries on a loaded 2-core VM), and each entry is dumped about ring / (ring - headroom)
times when reads come at urgent marks (see the module docstring): a DDP job of 8 bucket
all-reduces per step (bench/attach_overhead.py) reads its ring every 12 steps, or every
``READ_EVERY_S`` if its steps are slower. Larger rings cost more per entry (the dump's cache
misses: ~30 us per entry at 1024)."""

READ_EVERY_S = 1.0
"""The least time between a step's end and a time-bound read of its entries (the soonest a
live view gets a report no other read made due)."""
READ_EVERY_NS = int(READ_EVERY_S * 1e9)
READ_BUDGET = 0.001
"""The share of the job's own CPU the time-bound reads may take: after a dump that cost ``c``
of CPU, the next time-bound read waits until the process has spent ``c / READ_BUDGET`` of CPU
(every thread of it; at least :data:`READ_EVERY_S` of wall time, at most
:data:`READ_LATEST_S`). Paced on the process's clock, not the wall's: a dump's cost is per ring
entry, new or not, and a loaded machine doubles it (2.5 ms for 128 entries idle, 4-5 ms at load
20 on the 2-core VM) while the job gets a fraction of a core; a wall-paced read (4.5 ms every
2 s) was 1-2 % of such a job's CPU (the fp16 DDP bench at ~1 s wall steps read the ring at
0.56 of the steps, bench/attach_overhead.py). Idle, where the job runs a core, the process
clock keeps the wall's pace (~2.5 s)."""
READ_LATEST_S = 5.0
"""The longest a report waits for a time-bound read, however costly dumps are and however
little CPU the job gets (a live view's latency on a loaded machine)."""
READ_LATEST_NS = int(READ_LATEST_S * 1e9)

BELOW_PYTHON = "collectives run below Python (DDP's reducer, DTensor's functional collectives)"
"""What the reader sees, as its lost-part lines name it."""

RECENT_STEPS = 8
"""Step ends whose entries the headroom is sized on (the second largest of them, twice: one
burst between two step ends, an evaluation's collectives, does not predict the next step)."""


def configure_environment(env: Any = os.environ) -> None:
    """Size torch's Flight Recorder's ring (on by default in torch 2.13, at 2,000 entries:
    :data:`DEFAULT_BUFFER` here, so a dump stays short) and turn on NCCL's per-collective
    timing, for process groups created from now on, unless the job set them itself (under
    either of torch's names)."""
    if BUFFER_ENV not in env and LEGACY_BUFFER_ENV not in env:
        env[BUFFER_ENV] = str(DEFAULT_BUFFER)
    env.setdefault(TIMING_ENV, "1")


def ring_size(env: Any = os.environ) -> int:
    """The ring's entries as torch reads them (0: the recorder is off)."""
    try:
        return max(0, int(env.get(BUFFER_ENV, env.get(LEGACY_BUFFER_ENV, "0")).strip() or 0))
    except ValueError:
        return 0


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
    ``urgent``: the unread entries reach the ring less its headroom (wake the sender now).
    The sender expands it only once :meth:`due` (agent/pending.py): a read walks the whole
    ring, so reports wait for one read per near-full ring rather than one per batch."""

    __slots__ = ("_reader", "made_ns", "marks", "urgent")

    def __init__(
        self,
        reader: FlightRecorderReader,
        marks: dict[str, int],
        urgent: bool = False,
        made_ns: int = 0,
    ) -> None:
        self._reader = reader
        self.marks = marks
        self.urgent = urgent
        self.made_ns = made_ns
        """``time.perf_counter_ns()`` at the step end (0: due at once)."""

    def due(self, now_ns: int | None = None, cpu_ns: int | None = None) -> bool:
        """Sender thread: whether to read now: the last dump reaches this mark already, a step
        end since asked for a read (its mark was urgent), or the mark is :data:`READ_EVERY_S`
        old and the job has spent the last dump's CPU over :data:`READ_BUDGET` since it, or
        the mark is :data:`READ_LATEST_S` old. ``now_ns`` is ``time.perf_counter_ns()``,
        ``cpu_ns`` ``time.process_time_ns()`` (read here when not given)."""
        r = self._reader
        if self.urgent or r.wanted or r.covers(self.marks) or not r.unclaimed(self.marks):
            return True
        age = (time.perf_counter_ns() if now_ns is None else now_ns) - self.made_ns
        if age < READ_EVERY_NS:
            return False
        if age >= READ_LATEST_NS:
            return True
        cpu = time.process_time_ns() if cpu_ns is None else cpu_ns
        return cpu - r.cpu_at_dump_ns >= r.read_every_cpu_ns

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
        self._cache: dict[str, tuple[list[int], list[Entry]]] = {}
        """The last dump's entries of each watched group: their sequence numbers (ascending)
        and the entries, so that each take visits its step's entries only."""
        self._cache_top: dict[str, int] = {}
        self.dumps = 0
        """Dumps taken (each walks the whole ring: what reading costs, bench/attach_overhead)."""
        self.read_every_cpu_ns = 0
        """The process CPU a time-bound read waits for after the last dump: that dump's CPU
        over :data:`READ_BUDGET`."""
        self.cpu_at_dump_ns = 0
        """``time.process_time_ns()`` at the last dump."""
        self._dumped_at = 0.0
        self._timed: set[str] = set()
        """Groups whose device durations were asked for (:meth:`device_duration`), indexed
        with the watched ones."""
        self.wanted = False
        """A step end asked for a read (an urgent mark; set on the training thread, cleared by
        the sender as it dumps): the reports waiting before it are due too."""
        self._last_marks: dict[str, int] = {}
        self._recent: deque[int] = deque(maxlen=RECENT_STEPS)
        """The watched entries (scaled by ``share``) each of the last steps issued, as the
        training thread saw them at step ends: the headroom left for a late sender
        (``_urgent``). Recent ones only: one burst (an evaluation's collectives between two
        steps) would otherwise have the ring dumped at every step end for the rest of the run."""
        self.ring = 0
        """The ring's entries (torch's, read when a group is first watched)."""
        self.share = 1.0
        """All entries per watched entry in the last dump (>= 1: other groups fill the ring
        too); written by the sender thread, read at step ends."""
        self.most_per_step = 0
        """The most watched entries (scaled by ``share``) one step issued: the ring a job
        needs at least, said if entries were lost."""
        self.typical = 0
        """The watched entries (scaled) of a typical recent step, as of the last step end: a
        step past twice that before its end is a burst (:meth:`claim`)."""
        self._needed: set[str] = set()
        """The dumps whose recorders hold the watched groups' entries (fr_entries.dumps_of)."""
        self.wake: Any = None
        """The sender's wake-up (a ``threading.Event``; agent/outbox.py), set by the attach's
        session: a burst between two step ends asks for a read before the ring turns over."""

    def watch(self, group: Any, label: str) -> None:
        """Read ``group``'s unseen collectives from now on (a private call per step end: a
        failure turns the reader off and says why)."""
        if self.off_reason:
            return
        self.ring = ring_size()
        if not self.ring:
            self.turn_off(f"torch's Flight Recorder is off ({BUFFER_ENV} unset or 0)")
            return
        needed = dumps_of(group)
        gone = missing_dumps(needed) if self._dump is None else []
        if gone:  # a CUDA build still has NCCL's dump: never read a gloo group's as empty
            self.turn_off(f"torch has no {', '.join(gone)} (its recorder holds this group's)")
            return
        self._needed |= needed
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
        _say(BELOW_PYTHON, reason)

    def claim(self, group: Any, before: int) -> None:
        """Training thread, after a wrapped call on a watched group: the entries it made are
        the wrappers' own (see the module docstring)."""
        g = self.groups.get(group.group_name)
        if g is None:
            return
        after = int(group._get_sequence_number_for_group())
        g.claimed.update(range(before + 1, after + 1))
        if self.wanted:  # a read is asked for already
            return
        # A burst between two step ends (an evaluation's gathers through the wrappers, 130 on
        # a small HF eval set) turns the ring over under the entries of the steps before it
        # that no read took yet (DDP's reducer's, waiting for a read at a step end that comes
        # too late). Once this step has issued more than twice a typical step's entries and
        # the ring is a quarter turned over since the oldest unread one, those steps'
        # reports are due now: the rest of the ring is the sender's time to come round, one
        # read per burst. Steps of their usual size never wake it here (their reads stay
        # the step ends' own: no dump more per step).
        last = self._last_marks.get(g.name, g.taken)
        share = self.share
        if (
            last > g.taken
            and after - g.taken > len(g.claimed)  # something for a read to take
            and (after - last) * share > 2 * self.typical
            and (after - g.taken) * share >= self.ring // 4
        ):
            self.wanted = True
            wake = self.wake
            if wake is not None:
                wake.set()

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
        urgent = self._urgent(marks)
        if urgent:
            self.wanted = True
        return RecorderMark(self, marks, urgent, time.perf_counter_ns())

    def unclaimed(self, marks: dict[str, int]) -> list[str]:
        """Sender thread: the groups with entries up to their mark that the wrappers did not
        record themselves (only those need a dump: a mesh's group whose every collective went
        through a wrapped method, eager FSDP2's, needs none)."""
        out = []
        for name, top in marks.items():
            g = self.groups.get(name)
            if g is not None and top > g.taken:
                claimed = g.claimed
                if any(seq not in claimed for seq in range(g.taken + 1, top + 1)):
                    out.append(name)
        return out

    def covers(self, marks: dict[str, int]) -> bool:
        """Whether the last dump reaches every mark (a take needs no new dump)."""
        top = self._cache_top
        return all(top.get(n, -1) >= t for n, t in marks.items())

    def _urgent(self, marks: dict[str, int]) -> bool:
        """Training thread: whether the unread entries leave less than the headroom before the
        ring turns over: the larger of a quarter of the ring and two of the second largest of
        the last eight steps (a step one burst made large, an evaluation's collectives or the
        entries a paused attach left unread, does not predict the next: sized on the largest,
        the headroom outgrew the ring and every one of the next eight steps woke the sender for
        a dump); integers and dict reads only."""
        backlog = step = 0
        last = self._last_marks
        for name, top in marks.items():
            g = self.groups.get(name)
            if g is not None:
                unread = top - g.taken
                if unread > len(g.claimed):  # some entry the wrappers did not record
                    backlog += unread
                step += max(0, top - last.get(name, g.taken))
        self._last_marks = marks
        share = self.share
        recent = self._recent
        recent.append(int(step * share + 0.5))
        typical = sorted(recent)[-2] if len(recent) > 1 else recent[0]
        self.typical = typical
        headroom = max(self.ring // 4, 2 * typical)
        return int(backlog * share) >= self.ring - headroom and self.ring > 0

    def take(self, marks: dict[str, int]) -> list[RecorderOp]:
        """Sender thread: every entry of a watched group up to its mark not yet taken nor
        claimed by the wrappers, once."""
        out: list[RecorderOp] = []
        try:
            need = self.unclaimed(marks)
            cache = self._entries({n: marks[n] for n in need}) if need else {}
        except Exception as exc:
            self.errors += 1
            self.turn_off(f"the Flight Recorder dump failed ({exc!r})")
            return out
        offset = time.perf_counter_ns() - time.time_ns()
        lost_before = self.lost
        issued = sum(max(0, top - g.taken) for n, top in marks.items() if (g := self.groups.get(n)))
        self.most_per_step = max(self.most_per_step, int(issued * self.share))
        for name, top in marks.items():
            g = self.groups.get(name)
            if g is None or top <= g.taken:
                continue
            seqs, entries = cache.get(name, ((), ()))
            seen: set[int] = set()
            for i in range(bisect_right(seqs, g.taken), bisect_right(seqs, top)):
                entry = entries[i]
                seq = seqs[i]
                seen.add(seq)
                if entry.is_p2p or seq in g.claimed:
                    continue
                c = collective_of(entry, g.size, g.label)
                if c is not None:
                    out.append(RecorderOp(c, entry.time_created_ns + offset))
            for seq in range(g.taken + 1, top + 1):
                if seq not in seen and seq not in g.claimed:
                    self.lost += 1
                g.claimed.discard(seq)
            g.taken = top
        if self.lost and not lost_before:
            _say(f"some {BELOW_PYTHON}", self._overrun())
        out.sort(key=lambda op: op._issue_ns)
        return out

    def _overrun(self) -> str:
        """Why entries were lost, and what to do: a ring smaller than two of the largest
        step's entries needs a larger size; a larger one was read too late (the sender thread
        stalled, or starved on a loaded machine), and a larger size only buys it more time."""
        need = 2 * max(self.most_per_step, 1)
        said = f"torch's Flight Recorder ring ({self.ring} entries) was overwritten before a read"
        if need > self.ring:
            return f"{said}; set {BUFFER_ENV} to at least {need}"
        return (
            f"{said}, although it holds two steps' entries ({need}): the agent's sender thread "
            f"read it late (a stalled thread or a loaded machine); a larger {BUFFER_ENV} gives "
            "it more time"
        )

    def device_duration(self, name: str, seq: int, op: CollectiveOp) -> float | bool | None:
        """Sender thread: the device duration [s] torch measured for collective ``seq`` of
        group ``name`` (NCCL with ``TORCH_NCCL_ENABLE_TIMING=1``: CUDA events on the NCCL
        stream, nothing held by zeroscope); False while its entry is not retired yet (ask
        again), None when it will not come (the ring dropped it, no timing, another op)."""
        self._timed.add(name)
        try:
            cache = self._entries({name: seq}, fresh=True)
        except Exception as exc:
            self.errors += 1
            self.turn_off(f"the Flight Recorder dump failed ({exc!r})")
            return None
        seqs, entries = cache.get(name, ([], []))
        i = bisect_left(seqs, seq)
        if i == len(seqs) or seqs[i] != seq:
            return None  # overwritten before this read (or never recorded)
        entry = entries[i]
        if OPS.get(entry.profiling_name.rpartition(":")[2]) != op:
            return None  # not the op asked about: never another op's figure
        duration_ms = entry.duration_ms
        if duration_ms is None or entry.state != "completed":
            timed = os.environ.get(TIMING_ENV, "") == "1"
            return False if timed and entry.state != "completed" else None
        return float(duration_ms) / 1e3

    def _entries(
        self, marks: dict[str, int], fresh: bool = False
    ) -> dict[str, tuple[list[int], list[Entry]]]:
        """The watched (and timed) groups' entries, dumped again only when the last dump does
        not reach every mark (one dump serves the reports of a batch), or, ``fresh``, when it
        is older than :data:`FRESH_S` (an entry's duration appears once torch's watchdog
        retires it)."""
        stale = fresh and time.monotonic() - self._dumped_at > FRESH_S
        if stale or not self.covers(marks):
            self._dumped_at = time.monotonic()
            cpu_ns = time.thread_time_ns()
            raw = self._dump() if self._dump is not None else dump_all(self._needed)
            self.wanted = False
            parts = [entries_of(bytes(raw))] if isinstance(raw, (bytes, bytearray)) else raw
            self.dumps += 1
            self.read_every_cpu_ns = int((time.thread_time_ns() - cpu_ns) / READ_BUDGET)
            self.cpu_at_dump_ns = time.process_time_ns()
            cache, share = index_by_group(parts, self.groups, self._timed)
            self._cache = cache
            self._cache_top = {n: seqs[-1] for n, (seqs, _) in cache.items() if seqs}
            if share is not None:
                self.share = share
        return self._cache


def _say(part: str, reason: str) -> None:
    """Once per part: what the reader lost and why (the session's console line and Log event)."""
    try:
        from .session import SESSION

        SESSION.lost(part, reason)
    except Exception:
        pass


READER = FlightRecorderReader()
