"""Collective timing without synchronizing anything.

Each collective is tracked from issue (when the engine hands us its async Work) to completion:

- gloo / CPU: ``work.get_future().then(cb)``; the callback runs on the backend's thread when the
  op completes and stamps ``perf_counter_ns`` (or the end of ``wait()`` if that comes first).
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

import threading
import time
from typing import Any

from .schema import Collective, CollectiveOp


class CollectiveRecord:
    """One collective in flight or done; turned into a schema.Collective once complete."""

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
        "waited",
    )

    def __init__(
        self, op: CollectiveOp, nbytes: int, group_size: int, prefetched: bool, label: str
    ) -> None:
        self.op = op
        self.nbytes = nbytes
        self.group_size = group_size
        self.prefetched = prefetched
        self.label = label
        self.start_ns = time.perf_counter_ns()
        self.end_ns: int | None = None
        self.exposed_ns = 0
        self.waited = False
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
            if self.end_ns is None:
                return None
            duration = (self.end_ns - self.start_ns) / 1e9
            exposed = self.exposed_ns / 1e9
        return Collective(
            op=self.op,
            nbytes=self.nbytes,
            group_size=self.group_size,
            start_s=start_s,
            duration_s=max(duration, 0.0),
            # Inside wait() the op finished; a few µs of wait() overhead after completion are
            # not comm time, so exposed is capped at the op's duration.
            exposed_s=min(max(exposed, 0.0), max(duration, 0.0)),
            prefetched=self.prefetched,
            label=self.label,
        )


class TrackedWork:
    """What ``Telemetry.collective`` returns: use its ``wait()`` instead of the Work's."""

    __slots__ = ("record", "work")

    def __init__(self, work: Any, record: CollectiveRecord) -> None:
        self.work = work
        self.record = record

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        rec = self.record
        events = rec.cuda_events
        if events is not None:
            events[1] = _cuda_event()
        t0 = time.perf_counter_ns()
        try:
            return self.work.wait(*args, **kwargs)
        finally:
            t1 = time.perf_counter_ns()
            if events is not None:
                events[2] = _cuda_event()
            else:
                rec.exposed_ns += t1 - t0
                if rec.end_ns is None or t1 < rec.end_ns:
                    rec.end_ns = t1
            rec.waited = True

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def get_future(self) -> Any:
        return self.work.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)


def _cuda_event() -> Any:
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


class CollectiveTracker:
    """Collectives issued on this rank; each step end takes the step's records."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._lock = threading.Lock()
        self._pending: list[CollectiveRecord] = []
        self.errors = 0

    def track(
        self,
        work: Any,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
    ) -> Any:
        try:
            rec = CollectiveRecord(op, nbytes, group_size, prefetched, label)
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
            with self._lock:
                self._pending.append(rec)
            return TrackedWork(work, rec)
        except Exception:
            self.errors += 1
            return work

    def take_all(self) -> list[CollectiveRecord]:
        """Every record issued since the last call (the step that just ended), complete or
        not: the step's report resolves them, waiting for those still in flight."""
        with self._lock:
            taken, self._pending = self._pending, []
        return taken
