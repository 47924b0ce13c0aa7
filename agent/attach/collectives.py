"""Every collective of every engine, seen where all their paths end: the ``ProcessGroup``
methods, wrapped at class level.

DeepSpeed caches ``torch.distributed`` functions at start-up, FSDP2 calls the ``*_single``
methods, a script's own DDP comm hook calls ``dist.all_reduce``: all of them end in a Python
call of a ``ProcessGroup`` method, so wrapping the class catches every group, including groups
created before the wrap. (DDP's built-in reducer calls the backend from C++, below this: its
all-reduces are read from torch's Flight Recorder, :mod:`.flight_recorder`.) Each call costs
the training thread two clock reads, a size computation and one list append (and, on a group
the recorder reader watches, two reads of its sequence number); nothing is timed per op beyond
that:

- completion: the end of ``Work.wait()`` (also wrapped at class level; the time spent inside
  it is the *exposed* time), or the work's future when a consumer asked for it
  (``Work.get_future``: DDP's comm hooks hand futures to the reducer and never call ``wait``),
  whichever comes first. No future callback is attached to ops nobody asked a future of (that
  per-op callback, a GIL hand-off on the backend's thread, is what the agent's overhead budget rules out).
  An op nobody waited on is resolved at the step boundary, in bulk: complete then (or its
  work object gone) means it ended by that boundary; one still running is left to the step's
  pending report (agent/pending.py), which keeps it in its step. No clock saw such an op end,
  so its clock is ``none`` (bytes exact, duration and exposed NA); nor is an op on GPU tensors
  timed here (``wait()`` returns at enqueue there): clock ``none`` too. Only an op on CPU
  tensors whose end the host saw is clock ``host``.
- bytes follow nccl-tests (``agent/schema.py``): the full gathered size for all-gather and
  reduce-scatter, the buffer for all-reduce and broadcast.

All-to-all (an expert-parallel layer's token routing: ``all_to_all_single`` / ``all_to_all``)
is recorded as ``all_to_all``, its bytes what this rank sends. A barrier is ``barrier``, 0
bytes: its time is the rank's wait for the others, which would otherwise pass for the rank's
compute (the rank waiting for a straggler, not the straggler, would look slow). ``gather`` and
``scatter`` are recorded with S the whole gathered (scattered) size, every rank's share times
the group, as nccl-tests count it, on the root and the others alike.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup, Work

from zeroscope.agent.collective_record import (
    END,
    EXPOSED,
    FIELDS,
    GROUP,
    LABEL,
    NBYTES,
    OP,
    PREFETCHED,
    REF,
    START,
    book_wait,
    to_wire,
)
from zeroscope.agent.comm import CollectiveTracker
from zeroscope.agent.device_collective import resolve_device, sequence_of, stall_event
from zeroscope.agent.schema import Collective, CollectiveOp

from . import patches
from .flight_recorder import READER as RECORDER

_now = time.perf_counter_ns

MAX_IN_FLIGHT = 10_000
"""Ops kept while no step boundary takes them (no engine found yet); beyond it the oldest half
is dropped and counted in ``abandoned``."""

# A record is the agent's one host record (agent/collective_record.py: a plain list, cheapest to
# build on the training thread) with a tail of the attach's own.
KEY, CUDA, MEASURED, SEQUENCE, STALL, SEEN = range(len(FIELDS), len(FIELDS) + 6)
"""``KEY``: ``id(work)`` while it waits in ``CollectiveLog.waiting``. ``SEQUENCE``, ``STALL``,
``SEEN`` (GPU ops, agent/device_collective.py): (group, sequence number) where torch's Flight
Recorder has the op's device duration; the compute stream's events around its ``wait()``; when
it was first found complete. ``CUDA``: the op's tensors are on a GPU, where ``wait()`` returns once the op is enqueued on
the device, so no host clock here measures it (its clock is ``none``). ``MEASURED``: the end
was seen by the host (``wait()`` returned, or the work's future ran), not stamped at a step
boundary."""


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.nbytes
    return sum(_bytes(t) for t in x)


def _is_cuda(x: Any) -> bool:
    """Whether the first tensor in ``x`` (a tensor or nested lists of them) is on a GPU."""
    while not isinstance(x, torch.Tensor):
        if not x:
            return False
        x = x[0]
    return x.is_cuda


def _first(args: tuple) -> int:
    return _bytes(args[0])


def _second(args: tuple) -> int:
    return _bytes(args[1])


def _nothing(args: tuple) -> int:
    return 0


SHARED_OUT = frozenset({"gather", "scatter"})
"""Ops whose tensors on a rank hold its share only (the root's list holds them all): S, as
nccl-tests count it (the whole gathered or scattered size), is the share times the group."""


def _barrier_on_device() -> bool:
    """Whether a barrier's ``wait()`` measures more than the wait for the other ranks: in a
    job that uses CUDA, torch's NCCL barrier blocks the host until the current stream drains
    (``WorkNCCL::synchronize``), this rank's queued kernels included: it is then taken as the
    GPU ops are (the compute stream's stall around its ``wait()``). On CPU (gloo) ``wait()``
    returns when the last rank arrived: the host's clock."""
    return torch.cuda.is_initialized()


OPS: dict[str, tuple[CollectiveOp, Callable[[tuple], int]]] = {
    # ProcessGroup method: (wire op, bytes from its positional arguments)
    "allreduce": ("all_reduce", _first),
    "allreduce_coalesced": ("all_reduce", _first),
    "allgather": ("all_gather", _first),  # (output lists, inputs): S = everything gathered
    "allgather_coalesced": ("all_gather", _first),
    "all_gather_single": ("all_gather", _first),  # (output, input)
    "_allgather_base": ("all_gather", _first),
    "allgather_into_tensor_coalesced": ("all_gather", _first),
    "all_gather_single_coalesced": ("all_gather", _first),
    "reduce_scatter": ("reduce_scatter", _second),  # (outputs, input lists): S = the input
    "reduce_scatter_single": ("reduce_scatter", _second),
    "_reduce_scatter_base": ("reduce_scatter", _second),
    "reduce_scatter_tensor_coalesced": ("reduce_scatter", _second),
    "reduce_scatter_single_coalesced": ("reduce_scatter", _second),
    "broadcast": ("broadcast", _first),
    "reduce": ("reduce", _first),
    # (output, input[, splits]) or (output list, input list): S = what this rank sends, as
    # nccl-tests' alltoall counts it (an expert-parallel layer's splits differ per rank)
    "all_to_all_single": ("all_to_all", _second),
    "alltoall_base": ("all_to_all", _second),
    "alltoall": ("all_to_all", _second),
    # no data: the time every rank waits for the last one to arrive
    "barrier": ("barrier", _nothing),
    "monitored_barrier": ("barrier", _nothing),
    # (outputs, inputs): each rank's share, which every rank holds (the root alone the rest)
    "gather": ("gather", _second),
    "scatter": ("scatter", _first),
    "send": ("p2p", _first),
    "recv": ("p2p", _first),
    "recv_anysource": ("p2p", _first),
}


class CollectiveLog(CollectiveTracker):
    """Collectives recorded by the class-level wrappers, resolved in bulk at step boundaries.

    A subclass of the agent's tracker so the live agent takes these records at ``step_end``
    exactly as it takes the ones reported through the API (which an attached job has none of).
    """

    def __init__(self) -> None:
        super().__init__(cuda=False)
        self.recording = True
        self.label = ""
        """What the engine is doing now (a phase, a bucket); stamped on each op issued."""
        self.records: list[list[Any]] = []
        self.waiting: dict[int, list[Any]] = {}
        """id(work) -> record, until its wait() or its resolution at a step boundary."""
        self.recorded = 0
        self.abandoned = 0

    def add(
        self,
        op: CollectiveOp,
        nbytes: int,
        group: int,
        issue_ns: int,
        work: Any,
        cuda: bool,
        sequence: tuple[str, int] | None = None,
    ) -> None:
        records = self.records
        if len(records) >= MAX_IN_FLIGHT:  # nobody takes them (no step boundary seen yet)
            self.abandoned += len(records) // 2
            del records[: len(records) // 2]
        rec = [op, nbytes, group, False, self.label, issue_ns, None, 0, None, 0, cuda, False]
        rec += (sequence, None, [0])
        if work is not None:
            rec[REF] = weakref.ref(work)
            rec[KEY] = key = id(work)
            self.waiting[key] = rec
        records.append(rec)
        self.recorded += 1

    def take_all(self) -> list[Any]:
        """The step that just ended: every op issued since the last call, as records the
        agent's pending report resolves (agent/pending.py). Ops nobody waited on that are
        complete now (or whose work object is gone) ended by this boundary: stamped now."""
        now = _now()
        # Swap first: an op issued by another thread meanwhile lands in the new list.
        pending, self.records = self.records, []
        waiting = self.waiting
        out: list[Any] = []
        for rec in pending:
            if not rec[END]:
                ref = rec[REF]
                work = ref() if ref is not None else None
                try:
                    done = work is None or work.is_completed()
                except Exception:
                    self.errors += 1
                    done = True
                if done:
                    rec[END] = now
            if rec[END] and waiting.get(rec[KEY]) is rec:
                del waiting[rec[KEY]]
            out.append(LoggedOp(rec, waiting))
        out += super().take_all()
        mark = RECORDER.mark() if RECORDER.groups else None
        if mark is not None:
            out.append(mark)  # last: the pending report expands it on the sender thread
        return out

    def clear(self) -> None:
        self.records = []
        self.waiting.clear()  # in place: the Work wrappers hold this very dict

    @property
    def in_flight(self) -> int:
        return len(self.records)


class LoggedOp:
    """One op of the log as the agent's pending report reads it (the interface of
    ``agent.comm.CollectiveRecord``): complete once its end is stamped (by ``wait()``, its
    future, or the step boundary), or once its work object says so."""

    __slots__ = ("_rec", "_waiting")

    cuda_events = None
    """Host timing only: the wrappers record no CUDA events."""

    def __init__(self, rec: list[Any], waiting: dict[int, list[Any]]) -> None:
        self._rec = rec
        self._waiting = waiting

    def resolve(self, step_start_ns: int, step_start_event: Any = None) -> Collective | None:
        rec = self._rec
        if not rec[END]:
            ref = rec[REF]
            work = ref() if ref is not None else None
            if work is not None and not work.is_completed():
                return None  # still in flight: the report waits (agent/pending.py)
            rec[END] = _now()
        # Resolved: no wait() or future will stamp it again. Whoever stamped its end (this
        # call, or the backend's thread through its future's callback after the boundary took
        # it unfinished), it leaves ``waiting`` now, or it would stay there for ever. From the
        # agent's sender thread: the training thread's wait() may pop it meanwhile.
        if self._waiting.get(rec[KEY]) is rec:
            self._waiting.pop(rec[KEY], None)
        # Host-timed only where the host saw the op end on CPU tensors (gloo: wait() returns
        # when the op has run). On a GPU, wait() and the future return at enqueue; and an end
        # stamped at the step boundary is the boundary's time: neither is a measurement.
        if rec[CUDA]:  # the device's own figures (agent/device_collective.py), as the engine's
            got = resolve_device(rec[SEQUENCE], rec[OP], rec[STALL], rec[SEEN])
            if got is None:
                return None  # the stall's events or torch's duration still to come
            duration, exposed = got
            return to_wire(
                op=rec[OP],
                nbytes=rec[NBYTES],
                group_size=rec[GROUP],
                start_s=(rec[START] - step_start_ns) / 1e9,
                duration_s=duration,
                exposed_s=exposed,
                prefetched=rec[PREFETCHED],
                label=rec[LABEL],
                clock="device",
            )
        measured = rec[MEASURED]
        return to_wire(
            op=rec[OP],
            nbytes=rec[NBYTES],
            group_size=rec[GROUP],
            start_s=(rec[START] - step_start_ns) / 1e9,
            duration_s=(rec[END] - rec[START]) / 1e9 if measured else None,
            exposed_s=rec[EXPOSED] / 1e9 if measured else None,
            prefetched=rec[PREFETCHED],
            label=rec[LABEL],
            clock="host",
        )


LOG = CollectiveLog()
"""This process's log (one per process, like the ProcessGroup classes it watches)."""

_installed: list[bool] = []
_lock = threading.Lock()


def _wrap_collective(name: str, op: CollectiveOp, size_of: Callable[[tuple], int]) -> Any:
    original = getattr(ProcessGroup, name)
    log = LOG
    groups = RECORDER.groups
    # Decided once per method, not per call: a barrier has no tensor to say its device; gather
    # and scatter hold a rank's share (S is the share times the group), and gather's device is
    # that of its input (its output list is empty off the root).
    barrier = size_of is _nothing
    scale = op in SHARED_OUT
    placed = 1 if op == "gather" else 0

    def collective(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not log.recording:
            return original(self, *args, **kwargs)
        issue = _now()
        if groups:  # the Flight Recorder is read: claim this call's entries as ours
            try:
                before = self._get_sequence_number_for_group()
            except Exception:
                before = None
            work = original(self, *args, **kwargs)
            if before is not None:
                try:
                    RECORDER.claim(self, before)
                except Exception:
                    log.errors += 1
        else:
            work = original(self, *args, **kwargs)
        try:
            tensors = args or tuple(kwargs.values())  # a keyword call: in the order given
            n = self.size()
            if barrier:
                log.add(op, 0, n, issue, work, _barrier_on_device())
            else:
                nbytes = size_of(tensors) * n if scale else size_of(tensors)
                if _is_cuda(tensors[placed]):  # its device duration is torch's, by sequence
                    log.add(op, nbytes, n, issue, work, True, sequence_of(self))
                else:
                    log.add(op, nbytes, n, issue, work, False)
        except Exception:
            log.errors += 1
        return work

    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = original.__doc__
    return collective


def _wrap_wait() -> Any:
    original = Work.wait
    waiting = LOG.waiting
    book = book_wait

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = waiting.pop(id(self), None)
        if rec is not None and rec[REF]() is not self:
            rec = None  # a dead op's address reused by this work: not its record
        if rec is None:
            return original(self, *args, **kwargs)
        if rec[CUDA]:
            return _wait_on_device(original, self, rec, args, kwargs)
        t0 = _now()
        try:
            return original(self, *args, **kwargs)
        finally:
            book(rec, t0, _now())
            rec[MEASURED] = True

    wait.__doc__ = original.__doc__
    return wait


def _wait_on_device(original: Any, work: Any, rec: list[Any], args: Any, kwargs: Any) -> Any:
    """A GPU op's ``wait()``: it only makes the current stream wait for the op, so the stall is
    read from events on that stream around it, when that stream is the device's compute
    (default) stream; a wait on a side stream (FSDP2's all-gather stream) stalls no compute,
    and its exposed time stays NA. No event while a CUDA graph is being captured."""
    before = None
    try:
        if (
            rec[STALL] is None
            and not torch.cuda.is_current_stream_capturing()
            and torch.cuda.current_stream() == torch.cuda.default_stream()
        ):
            before = stall_event()
    except Exception:
        LOG.errors += 1
    try:
        return original(work, *args, **kwargs)
    finally:
        t1 = _now()
        if not rec[END] or t1 < rec[END]:
            rec[END] = t1  # enqueued: the report may look at it (its figures are the device's)
        if before is not None:
            try:
                rec[STALL] = (before, stall_event())
            except Exception:
                LOG.errors += 1


def _stamp_when_done(rec: list[Any], _: Any) -> None:
    stamp_end(rec)


def stamp_end(rec: list[Any] | None) -> None:
    """``rec`` completed now (called from a future callback, on the backend's thread)."""
    if rec is not None:
        t = _now()
        rec[MEASURED] = True
        if not rec[END] or t < rec[END]:
            rec[END] = t


def _wrap_get_future() -> Any:
    original = Work.get_future
    waiting = LOG.waiting

    def get_future(self: Any, *args: Any, **kwargs: Any) -> Any:
        future = original(self, *args, **kwargs)
        rec = waiting.get(id(self))
        if rec is not None and rec[REF]() is self:  # not a dead op's reused address
            try:
                future.then(functools.partial(_stamp_when_done, rec))
            except Exception:
                LOG.errors += 1
        return future

    get_future.__doc__ = original.__doc__
    return get_future


def install() -> None:
    """Wrap the ProcessGroup collectives and ``Work.wait`` / ``Work.get_future`` (once)."""
    with _lock:
        if _installed:
            return
        codes = []
        for name, (op, size_of) in OPS.items():
            if hasattr(ProcessGroup, name):
                wrapper = _wrap_collective(name, op, size_of)
                codes.append(wrapper.__code__)
                patches.replace(ProcessGroup, name, wrapper)
        wait, get_future = _wrap_wait(), _wrap_get_future()
        codes += [wait.__code__, get_future.__code__]
        patches.replace(Work, "wait", wait)
        patches.replace(Work, "get_future", get_future)
        from . import postimport

        postimport.when_imported("torch._dynamo.eval_frame", lambda m: kept_out(m, codes))
        patches.on_restore(_stop)
        _installed.append(True)
        LOG.recording = True


def kept_out(eval_frame: Any, codes: list[Any], what: str = "around collectives") -> None:
    """Dynamo never compiles a frame of the wrappers. A compiled function that reaches a
    collective (FSDP1's forward calls them from Python; FSDP2's are kept out by torch) breaks
    its graph at the call, as at the C++ method without zeroscope; then, run eagerly, the
    wrapper's own frame and those of the helpers it calls would be more frames Dynamo
    compiles (a compiled 2-rank FSDP1 model went from 1 graph break and 0 compiled frames to 4
    and 5). Their code is marked to run eagerly, callees included (torch's frame execution
    strategy, as its ``skip_code`` sets it; nothing changes outside Dynamo's frame hook), so
    what Dynamo sees is what it saw. The optimizer hooks are kept out the same way (a compiled
    ``optimizer.step()``: agent/attach/torch_loop.py). If torch renamed it, said once and left
    as it is."""
    try:
        skip = eval_frame.FrameAction.SKIP
        strategy = eval_frame.FrameExecStrategy(skip, skip)
        for code in codes:
            eval_frame.set_code_exec_strategy(code, strategy)
    except Exception as exc:
        from .session import SESSION

        SESSION.lost(f"compiled graphs as without zeroscope {what}", repr(exc))


def _stop() -> None:
    LOG.recording = False
    LOG.clear()
    _installed.clear()


def installed() -> bool:
    """Whether the wrappers are in place now."""
    return bool(_installed)
