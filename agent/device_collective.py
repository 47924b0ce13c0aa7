"""A collective on a GPU, timed with nothing held: one definition for the engine and the attach.

- Duration: what torch itself measured on the NCCL stream, read from its Flight Recorder
  (``TORCH_NCCL_ENABLE_TIMING=1``: a start and an end CUDA event per collective; the entry's
  ``duration_ms`` once torch's watchdog retires the work), found by the op's group and
  sequence number, read on the host when the op is issued (one integer read). zeroscope
  records no event on the NCCL stream and attaches no future callback: a callback runs on a
  pool stream and ``recordStream``s every output of the op, which parked each freed gather
  buffer until the GPU passed it (``memory_reserved`` grew with the agent on). No entry (the
  ring overwritten before a read, timing off, an op of a group the agent cannot name): the
  duration is NA (clock ``none``), never the host's enqueue gap.
- Exposed: the compute stream's stall, CUDA events on the current stream just before and just
  after ``wait()`` (which on NCCL only makes that stream wait for the op): the time between
  them is the device time compute waited for the collective, ~0 when it had already finished.
  Host time inside ``wait()`` is not it (it returns at enqueue).

Both are read on the agent's sender thread, lazily (``query()``, never ``synchronize()``).
"""

from __future__ import annotations

import time
from typing import Any

from .schema import CollectiveOp

GIVE_UP_S = 2.0
"""How long after its stall events completed an op's report waits for torch's duration (the
watchdog retires a work within ~0.1 s; a ring overwritten meanwhile never gives one)."""

PENDING = False
"""``device_duration``'s "not yet": ask again later."""


def sequence_of(group: Any) -> tuple[str, int] | None:
    """(name, sequence number) of ``group``'s latest collective, read right after issuing one
    (a private torch call: None when it is missing, and the duration is then NA)."""
    try:
        return str(group.group_name), int(group._get_sequence_number_for_group())
    except Exception:
        return None


_default: list[Any] = [None, ""]
"""The default group last seen and its name (read once per group, not per op)."""


def default_group_sequence(group_size: int) -> tuple[str, int] | None:
    """The default group's latest collective when an op of ``group_size`` ranks was just issued
    on it (the bundled engine's data-parallel group is the world); None for an op of a smaller
    group, which the agent API does not name (its duration is then NA, never another op's).
    On the training thread, per GPU op: an attribute read and one integer read."""
    try:
        from torch.distributed import distributed_c10d

        group: Any = distributed_c10d._world.default_pg
        if group is None:
            return None
        if _default[0] is not group:  # a new default group (a job may make and destroy them)
            _default[:] = [group, str(group.group_name)]
        if group.size() != group_size:
            return None
        return _default[1], int(group._get_sequence_number_for_group())
    except Exception:
        return None


def device_duration(sequence: tuple[str, int] | None, op: CollectiveOp) -> float | bool | None:
    """Seconds torch measured on the device for the op, :data:`PENDING` while its entry is not
    retired, None when it will not come."""
    if sequence is None:
        return None
    from .attach.flight_recorder import READER, ring_size

    if not ring_size() or READER.off_reason:
        return None
    name, seq = sequence
    return READER.device_duration(name, seq, op)


def resolve_device(
    sequence: tuple[str, int] | None,
    op: CollectiveOp,
    stall: tuple[Any, Any] | None,
    seen: list[int],
) -> tuple[float | None, float | None] | None:
    """(duration, exposed) in seconds, each None where not measured, once the stall events
    have completed; None while not (ask again). ``stall`` is the (before, after) events around
    the wait (None: never waited: exposed NA); ``seen`` a one-item list the caller keeps, the
    host instant the op was first found complete (0 until then), for :data:`GIVE_UP_S`."""
    exposed = None
    if stall is not None:
        before, after = stall
        if not after.query():
            return None
        exposed = before.elapsed_time(after) / 1e3
    duration = device_duration(sequence, op)
    if duration is PENDING:
        now = time.monotonic_ns()
        if not seen[0]:
            seen[0] = now
            return None
        if now - seen[0] < GIVE_UP_S * 1e9:
            return None
        duration = None
    return duration, exposed


def stall_event() -> Any:
    """A timing event on the current stream now (the compute stream, around a ``wait()``)."""
    from .comm import _cuda_event

    return _cuda_event()
