"""One collective as the agent records it, and the one rule that turns it into the wire's.

Three recorders make collective records: the bundled engine's host seam (agent/host_seam.py,
in C as agent/_seam.c), its device path (agent/comm.py) and the attach's class-level wrappers
(agent/attach/collectives.py). They share:

- one host record layout, :data:`FIELDS` (a plain list, the cheapest thing to build between
  the engine's kernels); the C seam's ``_seam.FIELDS`` is the same tuple (its twin test holds
  them equal) and the attach's record is this layout with a tail of its own;
- one wait bookkeeping, :func:`book_wait` (``_seam.book_wait`` in C where it was built): the
  time inside ``wait()`` is exposed time, its end the op's completion, the earliest end seen;
- one resolver, :func:`to_wire`: the wire's ``Collective`` built by keyword (a reordered
  schema field cannot shift a value into its neighbour), with "exposed <= duration" applied
  here once. The C seam's bulk ``resolve_hosts`` is its twin, built by keyword too.
"""

from __future__ import annotations

from typing import Any

from .schema import Collective, CollectiveClock, CollectiveOp

FIELDS = (
    "op",
    "nbytes",
    "group_size",
    "prefetched",
    "label",
    "start_ns",
    "end_ns",
    "exposed_ns",
    "ref",
)
"""A host record's fields, in order: ``[op, nbytes, group_size, prefetched, label, start_ns,
end_ns or None (in flight), exposed_ns, weak reference to the Work or None]``."""

OP, NBYTES, GROUP, PREFETCHED, LABEL, START, END, EXPOSED, REF = range(len(FIELDS))


def book_wait_python(rec: list[Any], t0: int, t1: int) -> bool:
    """A ``wait()`` on ``rec``'s op ran from ``t0`` to ``t1`` (host ns): the time inside is
    exposed time, its end the op's completion unless an earlier end was seen. True when this
    wait gave the record its first end."""
    rec[EXPOSED] += t1 - t0
    end = rec[END]
    if end is None:
        rec[END] = t1
        return True
    if t1 < end:
        rec[END] = t1
    return False


_book_wait_c: Any
try:
    from ._seam import book_wait as _book_wait_c
except ImportError:  # not built (not Linux, no compiler): the Python twin
    _book_wait_c = None

book_wait: Any = book_wait_python if _book_wait_c is None else _book_wait_c
""":func:`book_wait_python`, in C where the seam was built (one C call, cheaper than the
Python lines inside a ``wait()`` wrapper on the training thread)."""


def to_wire(
    *,
    op: CollectiveOp,
    nbytes: int,
    group_size: int,
    start_s: float,
    duration_s: float | None,
    exposed_s: float | None,
    prefetched: bool = False,
    label: str = "",
    clock: CollectiveClock = "host",
) -> Collective:
    """The wire's Collective. ``duration_s`` None: no clock saw the op end (clock ``none``,
    duration NA); ``exposed_s`` None: the loop's wait was not measured (exposed NA). A
    measured exposed time is capped at the duration: a few us of ``wait()``'s own overhead
    after the op completed are not comm time."""
    if duration_s is None:
        clock, duration_s = "none", 0.0
    elif duration_s < 0.0:  # clock order across threads: an end stamped before the issue
        duration_s = 0.0
    measured = exposed_s is not None
    if exposed_s is None or exposed_s < 0.0:
        exposed_s = 0.0
    elif exposed_s > duration_s and clock != "none":
        exposed_s = duration_s
    return Collective(
        op=op,
        nbytes=nbytes,
        group_size=group_size,
        start_s=start_s,
        duration_s=duration_s,
        exposed_s=exposed_s,
        prefetched=prefetched,
        label=label,
        clock=clock,
        exposed_measured=measured,
    )


def resolve_host_record(rec: list[Any], step_start_ns: int) -> Collective:
    """A host record that ended (``rec[END]`` set) as the wire's Collective, on the host axis
    of the step it was issued in."""
    start = rec[START]
    return to_wire(
        op=rec[OP],
        nbytes=rec[NBYTES],
        group_size=rec[GROUP],
        start_s=(start - step_start_ns) / 1e9,
        duration_s=(rec[END] - start) / 1e9,
        exposed_s=rec[EXPOSED] / 1e9,
        prefetched=rec[PREFETCHED],
        label=rec[LABEL],
        clock="host",  # CPU: the op ran while the host waited in wait(), on its clock
    )
