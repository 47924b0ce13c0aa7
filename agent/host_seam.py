"""The host side of collective timing (gloo / CPU): records, handles, their resolution.

On gloo / CPU there is no callback per op (the agent's overhead budget: a Python future callback runs on the backend's
thread and costs a GIL hand-off per collective). Completion is the end of ``wait()`` (which
is also where the *exposed* time is measured), or, for an op nobody waited on, the step
boundary that finds it complete: ``take_all`` asks ``work.is_completed()`` of every such op in
bulk when the step ends, and the step's pending report (agent/pending.py) asks again, from
the sender thread, for those still in flight. The end is thus an upper bound: an op that
finished before its ``wait()`` ends at that ``wait()`` (its duration includes the compute
between; the exposed time is exact).

A host record is a plain list (the layout of agent/collective_record.py, shared with the C seam
and the attach) and ``collective()`` returns a
:class:`HostWork` for it. Each Python call between the engine's kernels runs cold (~0.5 us
in place, against the agent's overhead budget), so on Linux both are made in C (agent/_seam.c: ``Recorder``, its
``HostWork``; ~3.5-4 us of CPU per op in place where this module's Python takes ~7-8,
bench/collective_cost.py); this module's :class:`Recorder` and :class:`HostWork` are the
same by the same rules, used where the C seam was not built, and the reference the tests
hold it to. The sender thread turns the lists into wire records (:func:`resolve_hosts`, a
step's records in one C call where the seam was built).

The Work is held only through a weak reference: the engine decides how long a Work lives, and
a Work keeps its tensors alive (holding it would raise the memory the user sees, e.g. a
ZeRO-3 gather's output kept past its free). A Work the engine dropped without waiting ended
by the boundary that finds it gone (dropping it means the engine no longer cares; gloo still
finishes it). The only strong reference the agent makes is the instant of an
``is_completed()`` call. A work object that cannot be weakly referenced falls back to the
future callback (the old path); one that has no ``is_completed`` is asked its future's
``done()``.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

from . import collective_record
from .collective_record import END, REF, book_wait, resolve_host_record
from .cost import now_ns
from .schema import Collective, CollectiveOp

try:
    from . import _seam
except ImportError:  # not built (not Linux, no compiler): the Python seam below
    _seam = None  # type: ignore[assignment]

NATIVE: Any = None if _seam is None else _seam.Recorder
"""The C seam's Recorder, or None where it was not built (tests set None to run the Python
seam)."""

weak = weakref.ref


class HostWork(tuple):
    """What ``collective()`` returns on CPU: ``(work, record, counters)``, a tuple so that
    making one runs no Python code. Use its ``wait()`` instead of the Work's: the end of
    ``wait()`` is the op's completion, the time inside it the exposed time. ``counters`` is
    the :class:`Recorder` whose counters its bookkeeping adds to (or None). The C seam's
    ``HostWork`` (agent/_seam.c) is the same by the same rules."""

    __slots__ = ()

    @property
    def work(self) -> Any:
        return self[0]

    @property
    def record(self) -> list[Any]:
        return self[1]

    def wait(self, timeout: Any = None) -> Any:
        # No *args/**kwargs (packing them costs ~0.4 us per op, against the agent's overhead budget); Work.wait's only
        # argument is an optional timeout (a timedelta).
        work, rec, counters = self
        t0 = now_ns()
        try:
            return work.wait() if timeout is None else work.wait(timeout)
        finally:
            t1 = now_ns()
            # The one bookkeeping (agent/collective_record.py), a C call where the seam was
            # built: no Python frame beside this one (the agent's overhead budget).
            if book_wait(rec, t0, t1) and counters is not None:
                counters.host_ended += 1
            if counters is not None:  # the agent's own part of wait(), not the wait itself
                counters.collective_ns += now_ns() - t1

    def is_completed(self) -> bool:
        return bool(self[0].is_completed())

    def get_future(self) -> Any:
        return self[0].get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self[0], name)


class Recorder:
    """``tel.collective`` on the host, in Python: appends a host record to ``pending`` and
    returns a :class:`HostWork`. The C seam's ``Recorder`` (agent/_seam.c; ~4 us less per op
    in place, bench/collective_cost.py) is this, by the same rules; tests hold them to it. A
    Work that cannot be weakly referenced goes to ``fallback(work, op, nbytes, group_size,
    prefetched, label, start_ns)``."""

    __slots__ = ("collective_ns", "fallback", "host_ended", "pending")

    def __init__(self, fallback: Any) -> None:
        self.pending: list[list[Any]] = []
        """Host records issued since the last ``take``."""
        self.fallback = fallback
        self.collective_ns = 0
        """The agent's own time in ``collective()`` and ``wait()``'s bookkeeping."""
        self.host_ended = 0
        """Records whose end ``wait()`` stamped."""

    def __call__(
        self,
        work: Any,
        *,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
    ) -> Any:
        t0 = now_ns()
        try:
            ref = weak(work)
        except TypeError:  # its future times it (CollectiveTracker.track)
            return self.fallback(work, op, nbytes, group_size, prefetched, label, t0)
        rec = [op, nbytes, group_size, prefetched, label, t0, None, 0, ref]
        self.pending.append(rec)  # atomic under the GIL; ``take`` swaps the list
        handle = HostWork((work, rec, self))
        self.collective_ns += now_ns() - t0
        return handle

    def take(self) -> list[list[Any]]:
        """The records issued since the last call; a fresh list collects the next ones."""
        taken, self.pending = self.pending, []
        return taken


def make_recorder(fallback: Any) -> Any:
    """The C seam's Recorder where it was built (Linux), else :class:`Recorder`."""
    return Recorder(fallback) if NATIVE is None else NATIVE(fallback)


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
    """Every record as :func:`resolve_host` would, when all are host records that ended; else
    None. In C where the seam was built (agent/_seam.c ``resolve_hosts``: the sender thread
    resolves a ZeRO-3 step's hundreds of records, ~2-3 us each in this module's Python as the
    thread runs cold); :func:`resolve_hosts_python` is its twin."""
    if NATIVE is not None:
        return _seam.resolve_hosts(records, step_start_ns, collective_record.Collective)
    return resolve_hosts_python(records, step_start_ns)


def resolve_hosts_python(records: list[Any], step_start_ns: int) -> list[Collective] | None:
    """:func:`resolve_hosts` in Python: agent/collective_record.py's one resolver per record.
    An op in flight (its end None) or a device record (not a list) raises TypeError at its
    first field read, which is the answer "not all ended on the host"."""
    try:
        return [resolve_host_record(rec, step_start_ns) for rec in records]
    except TypeError:
        return None


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
