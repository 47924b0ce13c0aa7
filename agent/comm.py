"""Collective timing without synchronizing anything.

Each collective is tracked from issue (when the engine hands us its async Work) to completion:

- gloo / CPU: no callback per op (issue 18: a Python future callback runs on the backend's
  thread and costs a GIL hand-off per collective). Completion is the end of ``wait()`` (which
  is also where the *exposed* time is measured), or, for an op nobody waited on, the step
  boundary that finds it complete: ``take_all`` asks ``work.is_completed()`` of every such op in
  bulk when the step ends, and the step's pending report (agent/pending.py) asks again, from
  the sender thread, for those still in flight. The end is thus an upper bound: an op that
  finished before its ``wait()`` ends at that ``wait()`` (its duration includes the compute
  between; the exposed time is exact).

  A host record is a plain list (fields ``OP`` ... ``REF`` below), made by one list display
  on the training thread, and ``collective()`` returns a :class:`HostWork`, a tuple: neither
  runs a Python ``__init__`` (issue 18: each frame there runs cold between the engine's
  kernels, ~10x its hot-loop cost). The sender thread turns the lists into wire records
  (:func:`resolve_host`).

  The Work is held only through a weak reference: the engine decides how long a Work lives, and
  a Work keeps its tensors alive (holding it would raise the memory the user sees, e.g. a
  ZeRO-3 gather's output kept past its free). A Work the engine dropped without waiting ended
  by the boundary that finds it gone (dropping it means the engine no longer cares; gloo still
  finishes it). The only strong reference the agent makes is the instant of an
  ``is_completed()`` call. A work object that cannot be weakly referenced falls back to the
  future callback (the old path); one that has no ``is_completed`` is asked its future's
  ``done()``.
- NCCL / CUDA: CUDA events recorded on the current stream at issue, at the start of ``wait()``
  and after it; ``elapsed_time`` is read lazily once ``event.query()`` says they completed, so
  the host never waits for the device. On CUDA, ``wait()`` only makes the compute stream wait,
  so the *exposed* time is device-side: compute-stream time from the wait point until the
  collective's result was usable (``wait_start -> end``), ~0 when the op was already done.
  The *duration* ends at the collective's own end, not at ``wait()``'s: the work's future calls
  back (at enqueue, on the host) with current streams that wait for the collective's CUDA
  events, so an event recorded there completes when the collective does. Ending at the event
  after ``wait()`` instead would add the compute overlapped with the op (busbw 10-1000x low
  under prefetch). ``work._get_duration()`` would be exact but needs the Work kept until the
  op completes, and a Work keeps its tensors alive: holding it would change the memory the
  user sees, so it is only the reference in ``bench/gpu_slot.py``.

Exposed time on CPU is host time spent inside ``wait()``. Unlike DeepSpeed's comms logger we
never synchronize the device to time an op (that would destroy the overlap we measure), and the
group size is the op's own group, not the world.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from .cost import SeamCost, now_ns
from .schema import Collective, CollectiveOp

OP, NBYTES, GROUP, PREFETCHED, LABEL, START, END, EXPOSED, REF = range(9)
"""The fields of a host record: ``[op, nbytes, group_size, prefetched, label, start_ns,
end_ns or None, exposed_ns, weakref to the Work]``."""

weak = weakref.ref


def host_record(
    work: Any,
    op: CollectiveOp,
    nbytes: int,
    group_size: int,
    prefetched: bool,
    label: str,
    start_ns: int,
) -> list[Any]:
    """A host record (raises TypeError for a Work that cannot be weakly referenced). The live
    agent builds the same list inline (agent/live.py ``collective``)."""
    return [op, nbytes, group_size, prefetched, label, start_ns, None, 0, weak(work)]


class HostWork(tuple):
    """What ``collective()`` returns on CPU: ``(work, record, cost)``, a tuple so that making
    one runs no Python code. Use its ``wait()`` instead of the Work's: the end of ``wait()`` is
    the op's completion, the time inside it the exposed time."""

    __slots__ = ()

    @property
    def work(self) -> Any:
        return self[0]

    @property
    def record(self) -> list[Any]:
        return self[1]

    def wait(self, timeout: Any = None) -> Any:
        # No *args/**kwargs (packing them costs ~0.4 us per op, issue 18); Work.wait's only
        # argument is an optional timeout (a timedelta).
        work, rec, cost = self
        t0 = now_ns()
        try:
            return work.wait() if timeout is None else work.wait(timeout)
        finally:
            t1 = now_ns()
            rec[EXPOSED] += t1 - t0
            end = rec[END]
            if end is None:
                rec[END] = t1
                if cost is not None:
                    cost.host_ended += 1
            elif t1 < end:
                rec[END] = t1
            if cost is not None:  # the agent's own part of wait(), not the wait itself
                cost.collective_ns += now_ns() - t1

    def is_completed(self) -> bool:
        return bool(self[0].is_completed())

    def get_future(self) -> Any:
        return self[0].get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self[0], name)


def stamp_host(rec: list[Any]) -> bool:
    """Whether a host record's op has completed, stamping its end now if it just turned out so
    (never waits). Complete once ``wait()`` returned, or the Work says so, or the engine
    dropped the Work (see the module doc)."""
    if rec[END] is not None:
        return True
    work = rec[REF]()
    if work is not None and not _is_completed(work):
        return False
    del work
    now = time.perf_counter_ns()
    if rec[END] is None:
        rec[END] = now
    return True


def resolve_host(rec: list[Any], step_start_ns: int) -> Collective | None:
    """A host record as the wire's Collective once complete, else None (in flight); ``start_s``
    on the host axis of the step it was issued in."""
    if not stamp_host(rec):
        return None
    (collective,) = resolve_hosts([rec], step_start_ns) or (None,)
    return collective


def resolve_hosts(records: list[Any], step_start_ns: int) -> list[Collective] | None:
    """Every record as :func:`resolve_host` would, in one comprehension (no call per record:
    a ZeRO-3 step has hundreds), when all are host records that ended; else None."""
    # Inside wait() the op finished; a few us of wait() overhead after completion are not
    # comm time, so exposed is capped at the op's duration. Positional: keywords cost more.
    # One pass: an op in flight (its end None) or a CollectiveRecord (not a list) raises
    # TypeError at its first field read, which is the answer "not all ended on the host".
    try:
        return [
            Collective(
                rec[OP],
                rec[NBYTES],
                rec[GROUP],
                (rec[START] - step_start_ns) / 1e9,
                duration := (rec[END] - rec[START]) / 1e9 if rec[END] > rec[START] else 0.0,
                rec[EXPOSED] / 1e9 if rec[EXPOSED] / 1e9 < duration else duration,
                rec[PREFETCHED],
                rec[LABEL],
            )
            for rec in records
        ]
    except TypeError:
        return None


class CollectiveRecord:
    """One CUDA collective (or a host one whose Work cannot be weakly referenced: timed by its
    future's callback) in flight or done; turned into a schema.Collective once complete."""

    __slots__ = (
        "comm_end",
        "cuda_events",
        "end_ns",
        "exposed_ns",
        "group_size",
        "label",
        "nbytes",
        "op",
        "prefetched",
        "start_ns",
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
        self.cuda_events: list[Any] | None = None  # [issue, wait_start, end] on CUDA
        self.comm_end: Any = None
        """On CUDA: an event that completes with the collective itself (see the module doc)."""

    def _on_complete(self, _fut: Any) -> None:
        now = time.perf_counter_ns()
        if self.end_ns is None or now < self.end_ns:
            self.end_ns = now

    def _on_device_complete(self, _fut: Any) -> None:
        try:
            self.comm_end = _cuda_event()
        except Exception:
            pass  # the duration falls back to the event after wait()

    def resolve(self, step_start_ns: int, step_start_event: Any = None) -> Collective | None:
        """The wire record once complete, else None (still in flight). ``start_s`` is on the
        axis of the step it was issued in (agent/timeline.py): the device's when
        ``step_start_event`` is given (CUDA), else the host's."""
        start_s = (self.start_ns - step_start_ns) / 1e9
        if self.cuda_events is not None:
            issue, wait_start, end = self.cuda_events
            if end is None or not end.query():
                return None
            own_end = self.comm_end
            if own_end is not None and own_end.query():
                duration = issue.elapsed_time(own_end) / 1e3
            else:
                duration = issue.elapsed_time(end) / 1e3
            exposed = wait_start.elapsed_time(end) / 1e3
            if step_start_event is not None:
                start_s = step_start_event.elapsed_time(issue) / 1e3
        else:
            if self.end_ns is None:  # stamped by wait() or the future's callback
                return None
            duration = (self.end_ns - self.start_ns) / 1e9
            exposed = self.exposed_ns / 1e9
        # Positional: the sender builds one per collective (issue 18), keywords cost more.
        # Inside wait() the op finished; a few us of wait() overhead after completion are not
        # comm time, so exposed is capped at the op's duration.
        duration = duration if duration > 0.0 else 0.0
        exposed = exposed if exposed > 0.0 else 0.0
        return Collective(
            self.op,
            self.nbytes,
            self.group_size,
            start_s,
            duration,
            exposed if exposed < duration else duration,
            self.prefetched,
            self.label,
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


def _is_completed(work: Any) -> bool:
    """``work.is_completed()``, or its future's ``done()`` for a work object without it; a work
    that can say neither is complete only through ``wait()``."""
    try:
        return bool(work.is_completed())
    except AttributeError:
        pass
    try:
        return bool(work.get_future().done())
    except Exception:
        return False


def _cuda_event() -> Any:
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


class CollectiveTracker:
    """Collectives issued on this rank; each step end takes the step's records."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._pending: list[list[Any]] = []
        """Host records issued since the last step end."""
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
        try:
            start = time.perf_counter_ns() if start_ns is None else start_ns
            if not self.cuda:
                try:  # never the Work itself (module doc)
                    host = host_record(work, op, nbytes, group_size, prefetched, label, start)
                except TypeError:
                    pass
                else:
                    self._pending.append(host)  # atomic under the GIL; take_all swaps the list
                    return HostWork((work, host, self.cost))
            rec = CollectiveRecord(op, nbytes, group_size, prefetched, label, start)
            if self.cuda:
                rec.cuda_events = [_cuda_event(), None, None]
                try:
                    work.get_future().then(rec._on_device_complete)
                except Exception:
                    pass  # no future: the duration ends with wait()
            else:
                try:
                    work.get_future().then(rec._on_complete)
                except Exception:
                    pass  # no future on this backend: completion = end of wait()
            self._objects.append(rec)
            return TrackedWork(work, rec, self.cost)
        except Exception:
            self.errors += 1
            return work

    def take_all(self) -> list[Any]:
        """Every record issued since the last call (the step that just ended), complete or
        not: the step's report resolves them, waiting for those still in flight. On CPU, ops
        nobody waited on that are complete now (or dropped) are stamped with this boundary."""
        # No lock (issue 18: ~0.3 us per collective): a record appended by another thread while
        # the list is swapped lands in ``taken``, the very list the step's report reads.
        taken, self._pending = self._pending, []
        cost = self.cost
        if cost is not None:
            cost.collectives += len(taken)
            cost.host_issued += len(taken)
        # Nearly always every record was waited on: the totals say so without a look at each
        # (~0.4 us per record between a ZeRO-3 step's kernels, issue 18).
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
