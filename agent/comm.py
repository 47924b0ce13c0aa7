"""Collective timing without synchronizing anything, and without holding anything.

Each collective is tracked from issue (when the engine hands us its async Work) to completion:

- gloo / CPU: agent/host_seam.py (no callback per op; completion at the end of ``wait()`` or at
  the step boundary that finds the op complete; the Work held only weakly).
- NCCL / CUDA: agent/device_collective.py, the definition the attach shares. The *duration* is
  torch's own, measured with CUDA events on the NCCL stream and read from its Flight Recorder
  by the op's group and sequence number (read at issue); the *exposed* time is the compute
  stream's stall, CUDA events on the current stream just before and after ``wait()`` (which on
  CUDA only makes that stream wait), ~0 when the op was already done. Both are read lazily
  once ``event.query()`` says they completed, so the host never waits for the device. No
  future callback is attached (it would ``recordStream`` the op's outputs on a pool stream and
  keep every freed gather buffer reserved until the GPU passed it), and the Work is not kept
  (it keeps its tensors alive).

A synchronous op (``work`` None: ``async_op=False`` returned nothing) finished before
``collective()`` was called: it is recorded (bytes, op, issue instant) with no time (clock
``none``: duration and exposed NA), and its handle's ``wait()`` returns at once. So is an op
issued while the stream captures a CUDA graph (agent/capture.py), whose own Work is returned.

Exposed time on CPU is host time spent inside ``wait()``. Unlike DeepSpeed's comms logger we
never synchronize the device to time an op (that would destroy the overlap we measure), and the
group size is the op's own group, not the world.
"""

from __future__ import annotations

import time
from typing import Any

from .capture import capturing
from .collective_record import END, to_wire
from .cost import SeamCost, now_ns
from .device_collective import default_group_sequence, resolve_device
from .host_seam import make_recorder, stamp_host
from .schema import Collective, CollectiveOp


class CollectiveRecord:
    """One CUDA collective (or a host one whose Work cannot be weakly referenced: timed by its
    future's callback) in flight or done; turned into a schema.Collective once complete."""

    __slots__ = (
        "cuda_events",
        "end_ns",
        "exposed_ns",
        "group_size",
        "label",
        "nbytes",
        "op",
        "prefetched",
        "seen",
        "sequence",
        "start_ns",
        "untimed",
    )

    def __init__(
        self,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool,
        label: str,
        start_ns: int | None = None,
    ) -> None:
        self.op = op
        self.nbytes = nbytes
        self.group_size = group_size
        self.prefetched = prefetched
        self.label = label
        self.start_ns = time.perf_counter_ns() if start_ns is None else start_ns
        self.end_ns: int | None = None
        self.exposed_ns = 0
        self.cuda_events: list[Any] | None = None
        """On CUDA: [issue, before wait(), after wait()] on the compute stream."""
        self.sequence: tuple[str, int] | None = None
        """On CUDA: (group name, sequence number), where torch's Flight Recorder has its
        duration (agent/device_collective.py)."""
        self.seen = [0]
        self.untimed = False
        """A synchronous op: it ran before the agent saw it (clock ``none``)."""

    def _on_complete(self, _fut: Any) -> None:
        now = time.perf_counter_ns()
        if self.end_ns is None or now < self.end_ns:
            self.end_ns = now

    def resolve(self, step_start_ns: int, step_start_event: Any = None) -> Collective | None:
        """The wire record once complete, else None (still in flight). ``start_s`` is on the
        axis of the step it was issued in (agent/timeline.py): the device's when
        ``step_start_event`` is given (CUDA), else the host's."""
        start_s = (self.start_ns - step_start_ns) / 1e9
        duration: float | None
        exposed: float | None
        if self.cuda_events is not None:
            issue, wait_start, end = self.cuda_events
            if end is None:  # not waited for (yet): no stall to read
                return None
            got = resolve_device(self.sequence, self.op, (wait_start, end), self.seen)
            if got is None:
                return None
            duration, exposed = got
            if step_start_event is not None:
                start_s = step_start_event.elapsed_time(issue) / 1e3
        else:
            if self.end_ns is None:  # stamped by wait() or the future's callback
                return None
            duration = None if self.untimed else (self.end_ns - self.start_ns) / 1e9
            exposed = None if self.untimed else self.exposed_ns / 1e9
        return to_wire(
            op=self.op,
            nbytes=self.nbytes,
            group_size=self.group_size,
            start_s=start_s,
            duration_s=duration,
            exposed_s=exposed,
            prefetched=self.prefetched,
            label=self.label,
            clock="host" if self.cuda_events is None else "device",
        )


class TrackedWork:
    """What ``Telemetry.collective`` returns: use its ``wait()`` instead of the Work's."""

    __slots__ = ("cost", "record", "work")

    def __init__(self, work: Any, record: CollectiveRecord, cost: SeamCost | None = None) -> None:
        self.work = work
        self.record = record
        self.cost = cost

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        rec = self.record
        events = rec.cuda_events
        if events is not None:
            return self._wait_device(events, args, kwargs)
        t0 = now_ns()
        try:
            return self.work.wait(*args, **kwargs)
        finally:
            t1 = now_ns()
            rec.exposed_ns += t1 - t0
            end = rec.end_ns
            if end is None or t1 < end:
                rec.end_ns = t1
            cost = self.cost
            if cost is not None:  # the agent's own part of wait(), not the wait itself
                cost.collective_ns += now_ns() - t1

    def _wait_device(self, events: list[Any], args: Any, kwargs: Any) -> Any:
        """CUDA: events around ``wait()``, which only makes the current stream wait."""
        enter = now_ns()
        events[1] = _cuda_event()
        t0 = now_ns()
        try:
            return self.work.wait(*args, **kwargs)
        finally:
            t1 = now_ns()
            events[2] = _cuda_event()
            cost = self.cost
            if cost is not None:
                cost.collective_ns += now_ns() - t1 + t0 - enter

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def get_future(self) -> Any:
        return self.work.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


class SyncDone:
    """The handle of a synchronous op (``work`` None): done already, ``wait()`` returns None."""

    __slots__ = ()

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None

    def is_completed(self) -> bool:
        return True


SYNC_DONE = SyncDone()


EVENT_DEVICE: list[int | None] = [None]
"""The GPU whose current stream every agent event goes on: the Hello's (set by the live agent's
``bind_device``/``hello``), not the current device, which an agent-API user who passes
``device="cuda:N"`` may never set (events on GPU 0's idle stream read ~0 s, and ``elapsed_time``
between two devices' events fails). None: the current device."""


def _cuda_event() -> Any:
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    index = EVENT_DEVICE[0]
    ev.record(None if index is None else torch.cuda.current_stream(index))
    return ev


class CollectiveTracker:
    """Collectives issued on this rank; each step end takes the step's records."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.recorder = make_recorder(self._untracked)
        """Makes the host records (agent/host_seam.py): ``collective()`` on the host is this
        very object's call once step 1 has begun (agent/live.py)."""
        self._objects: list[CollectiveRecord] = []
        """CollectiveRecords (CUDA, or timed by a future) issued since the last step end."""
        self.errors = 0
        self.cost: SeamCost | None = None
        """Where ``wait()``'s own bookkeeping is counted (the live agent's counters)."""

    def track(
        self,
        work: Any,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
        start_ns: int | None = None,
    ) -> Any:
        """The handle to return for ``work``: on the host the recorder's (it stamps its own
        issue instant), on CUDA a CollectiveRecord's, issued at ``start_ns`` (default now)."""
        try:
            if not self.cuda:
                return self.recorder(
                    work,
                    op=op,
                    nbytes=nbytes,
                    group_size=group_size,
                    prefetched=prefetched,
                    label=label,
                )
            start = time.perf_counter_ns() if start_ns is None else start_ns
            return self._untracked(work, op, nbytes, group_size, prefetched, label, start)
        except Exception:
            self.errors += 1
            return work

    def _synchronous(
        self,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool,
        label: str,
        start_ns: int,
    ) -> SyncDone:
        """A synchronous op, complete before it was handed to us: recorded with no time."""
        rec = CollectiveRecord(op, nbytes, group_size, prefetched, label, start_ns)
        rec.end_ns = rec.start_ns
        rec.untimed = True
        self._objects.append(rec)
        return SYNC_DONE

    def _untracked(
        self,
        work: Any,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool,
        label: str,
        start: int,
    ) -> Any:
        """A CollectiveRecord: a CUDA op, or a host one whose Work cannot be weakly
        referenced (timed by its future's callback; None, a synchronous op, among them)."""
        if work is None:
            return self._synchronous(op, nbytes, group_size, prefetched, label, start)
        if self.cuda and capturing():  # recorded into a CUDA graph, not run: no events
            self._synchronous(op, nbytes, group_size, prefetched, label, start)
            return work
        rec = CollectiveRecord(op, nbytes, group_size, prefetched, label, start)
        if self.cuda:
            rec.cuda_events = [_cuda_event(), None, None]
            # No future callback here: it would recordStream the op's outputs (module doc).
            rec.sequence = default_group_sequence(group_size)
        else:
            try:
                work.get_future().then(rec._on_complete)
            except Exception:
                pass  # no future on this backend: completion = end of wait()
        self._objects.append(rec)
        return TrackedWork(work, rec, self.cost)

    def take_all(self) -> list[Any]:
        """Every record issued since the last call (the step that just ended), complete or
        not: the step's report resolves them, waiting for those still in flight. On CPU, ops
        nobody waited on that are complete now (or dropped) are stamped with this boundary.
        The recorder's counters join the agent's here."""
        # No lock (the agent's overhead budget: ~0.3 us per collective): the recorder swaps its list in one step.
        recorder = self.recorder
        taken = recorder.take()
        cost = self.cost
        if cost is not None:
            # A wait() on another thread between the read and the reset is lost: accepted,
            # as for every counter here (agent/cost.py).
            cost.collective_ns += recorder.collective_ns
            cost.host_ended += recorder.host_ended
            recorder.collective_ns = recorder.host_ended = 0
            cost.collectives += len(taken)
            cost.host_issued += len(taken)
        # Nearly always every record was waited on: the totals say so without a look at each
        # (~0.4 us per record between a ZeRO-3 step's kernels, against the agent's overhead budget).
        if cost is None or cost.host_ended != cost.host_issued:
            still_open = 0
            for rec in [rec for rec in taken if rec[END] is None]:
                try:
                    if not stamp_host(rec):
                        still_open += 1  # in flight: its report waits (agent/pending.py)
                except Exception:
                    self.errors += 1
            if cost is not None:
                # Resynced to this step's records: an older one still open is the sender's
                # (it stamps it once complete), and its late wait() only makes a later step
                # end look again.
                cost.host_ended = cost.host_issued - still_open
        if not self._objects:
            return taken
        objects, self._objects = self._objects, []
        if cost is not None:
            cost.collectives += len(objects)
        return [*taken, *objects]
