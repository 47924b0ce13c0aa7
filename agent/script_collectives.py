"""Collectives a job reporting through the agent API issues beside the ones it reports: the
script of a bundled-engine job calling ``dist.all_reduce`` on its loss for a log line, a barrier,
an evaluation's gather. Read from torch's Flight Recorder, as the attach reads DDP's reducer.

The bundled engine records every collective it issues (agent/comm.py); the attach stands down
when the engine reports for itself (nothing counted twice), so the script's own collectives on
the same group were seen by nothing, and their time passed for compute. Here, for a job whose
data-parallel group is the default group (no pipeline or tensor-parallel layout), each step end
reads that group's sequence number (one integer: the training thread's whole share). The
sender thread then compares the step's collectives on the group with the engine's records of
ops as wide as the group:

- as many (nearly every step of nearly every job): the engine's own, claimed by sequence
  number, never dumped;
- more: the step's entries are read from the recorder (one dump per batch of reports, as for
  DDP) and matched in order against the engine's records by op and bytes (a gloo reduce-scatter
  the engine runs as an all-reduce of the same bytes matches too); what is left is the
  script's, labelled ``script``, with its bytes exact and its time what torch measured (none on
  gloo: duration NA). When the entries do not line up with the engine's records (the ring
  overwritten before the read, an op the recorder names otherwise), nothing is guessed: the
  watch says so once and stops (a ring a step overfills would cost a dump a step for nothing),
  and the steps from there show the engine's collectives only.
- fewer (an engine op on another group as wide as the default one): nothing can be told apart,
  nothing is added.

From the first step with such collectives on, step ends also say when the ring nears its turn
(the reader's urgency, agent/attach/flight_recorder.py), so the reads keep up with the job.
"""

from __future__ import annotations

import time
from typing import Any

from .attach.flight_recorder import (
    BUFFER_ENV,
    READER,
    RecorderMark,
    RecorderOp,
    _say,
    ring_size,
)
from .collective_record import GROUP, NBYTES, OP
from .comm import CollectiveRecord

LABEL = "script"
PART = "collectives issued beside the engine's (the script's own)"
"""What is said when a step's cannot be told from the engine's."""
SAME = {("reduce_scatter", "all_reduce")}
"""(the engine's op, the recorder's op) that are one collective: the engine runs a
reduce-scatter as an all-reduce of the whole buffer where the backend lacks one (gloo)."""


class ScriptWatch:
    """The default group, watched for collectives beside the engine's (module docstring)."""

    def __init__(self, group: Any, world: int) -> None:
        self.group = group
        self.world = world
        self.name = str(group.group_name)
        READER.watch(group, LABEL)
        g = READER.groups.get(self.name)
        if g is not None:
            g.taken = 0  # from the group's first collective: step 1 holds the engine's setup
        self.last = 0
        self.active = False
        """A step had collectives beside the engine's: step ends say when a read is urgent."""
        self.off = False
        """A step's entries did not line up with the engine's records, or the group became
        unreadable: no more marks (a ring a step overfills would cost a dump a step for
        nothing)."""

    @classmethod
    def create(cls, layout: Any) -> ScriptWatch | None:
        """A watch of this process's default group, when torch's Flight Recorder is on, the
        group spans more than one rank and no pipeline or tensor-parallel layout was said
        (their groups' collectives would not be the default group's); None otherwise."""
        if layout is not None or not ring_size() or READER.off_reason:
            return None
        try:
            from torch.distributed import distributed_c10d

            group = distributed_c10d._world.default_pg
            if group is None or group.size() < 2:
                return None
            watch = cls(group, int(group.size()))
        except Exception:
            return None
        return watch if watch.name in READER.groups else None

    def skip_issued(self) -> None:
        """Start again from the group's present sequence number, as if what was issued on it
        so far never was (bench/agent_overhead.py: its "off" steps and barriers issue
        collectives without the agent, which no job does between two of its steps)."""
        self.last = int(self.group._get_sequence_number_for_group())
        self.active = False
        g = READER.groups.get(self.name)
        if g is not None:
            g.taken = self.last
            g.claimed.clear()

    def mark(self, records: list[Any]) -> ScriptMark | None:
        """Training thread, at a step end: the group's sequence number now (None when the
        step issued nothing on it)."""
        if self.off:
            return None
        try:
            seq: int = self.group._get_sequence_number_for_group()
            prev, self.last = self.last, seq
            if seq == prev:
                return None
            urgent = self.active and READER._urgent({self.name: seq})
        except Exception:  # a destroyed group, a torch that moved the call: the step goes on
            self.off = True
            return None
        return ScriptMark(self, prev, seq, records, urgent)


def engine_ops(records: list[Any], world: int) -> list[tuple[str, int]]:
    """(op, bytes) of the engine's records of ops as wide as the default group, in order."""
    out = []
    for rec in records:
        if type(rec) is list:
            if rec[GROUP] == world:
                out.append((rec[OP], rec[NBYTES]))
        elif isinstance(rec, CollectiveRecord) and rec.group_size == world:
            out.append((rec.op, rec.nbytes))
    return out


def beside(read: list[RecorderOp], engine: list[tuple[str, int]]) -> list[RecorderOp] | None:
    """The recorder's ops of a step that are not the engine's, matched in order (None when
    some engine op found no entry: they do not line up, and nothing is guessed)."""
    out = []
    i = 0
    for op in read:
        c = op._collective
        if i < len(engine):
            want, nbytes = engine[i]
            if nbytes == c.nbytes and (want == c.op or (want, c.op) in SAME):
                i += 1
                continue
        out.append(op)
    return out if i == len(engine) else None


class ScriptMark:
    """A step end of a watched job, as the pending report reads a recorder mark (``urgent``,
    ``due``, ``expand``): the engine's share of its entries is settled on the sender thread
    before anything is read (module docstring). Only the sequence number and the step's
    records are taken on the training thread; the reader's mark is made on the sender's."""

    __slots__ = ("_engine", "_made", "_mark", "_prev", "_records", "_seq", "_watch", "urgent")

    def __init__(
        self, watch: ScriptWatch, prev: int, seq: int, records: list[Any], urgent: bool
    ) -> None:
        self.urgent = urgent
        self._watch = watch
        self._prev = prev
        self._seq = seq
        self._records = records
        self._made = time.perf_counter_ns()
        self._mark: RecorderMark | None = None
        self._engine: list[tuple[str, int]] | None = None

    def _settle(self) -> RecorderMark:
        mark = self._mark
        if mark is not None:
            return mark
        watch = self._watch
        mark = self._mark = RecorderMark(READER, {watch.name: self._seq}, self.urgent, self._made)
        g = READER.groups.get(watch.name)
        records, self._records = self._records, []
        if g is None:  # the reader turned off
            return mark
        engine = engine_ops(records, watch.world)
        if self._seq - self._prev <= len(engine):  # the engine's own (or none told apart)
            g.claimed.update(range(self._prev + 1, self._seq + 1))
        else:
            self._engine = engine
            watch.active = True
        return mark

    def due(self, now_ns: int | None = None, cpu_ns: int | None = None) -> bool:
        return self._settle().due(now_ns, cpu_ns)

    def expand(self) -> list[RecorderOp]:
        read = self._settle().expand()
        engine = self._engine
        if engine is None:
            return []
        found = beside(read, engine)
        if found is None:
            watch = self._watch
            if not watch.off:
                watch.off = True
                _say_unmatched(len(read), len(engine), READER.ring)
            return []
        return found


def _say_unmatched(read: int, engine: int, ring: int) -> None:
    """Said once, as the watch turns off."""
    _say(
        PART,
        f"a step's {read} recorder entries did not line up with the engine's {engine} "
        f"collectives (its ring of {ring} overwritten before a read: a larger {BUFFER_ENV} "
        "keeps more; or an op it names otherwise); the steps from there show the engine's only",
    )
