"""One report's collectives folded into the step's communication figures: per (op, group size)
the count, bytes, time, wait and the untimed / unexposed counts, the busy time and the sequence
fingerprint (zeroscope.state.rank.summarize turns them into OpTotals and a StepSummary).

A step's collectives have the same *shape* on every rank and from one step to the next (the
ops, their sizes and groups, what measured them, their labels); only their times differ. The
shape's figures (the groups and which collectives are in each, bytes, volume, the bus-bytes
numerator, the prefetch count, the fingerprint) are worked out once per distinct shape and
kept; a report then reads its times through C-level ``map`` and ``itemgetter`` calls and adds
them per group in issue order, the same additions as the per-collective loop
(:func:`fold_each`, which a report whose shape has an untimed or unmeasured collective, or a
0-second one, still goes through): the figures are equal to the last bit. A 16,384-rank step is
16,384 reports of tens of collectives each: the loop's per-collective bytecode was most of the
view's ingest.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import add, attrgetter, itemgetter
from typing import TYPE_CHECKING, Any

from .bandwidth import timed, timed_clock

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from zeroscope.agent.schema import Collective

Group = list[float]
"""[count, S, seconds, waited, untimed, unexposed, S of the collectives with a time > 0]."""

_SHAPE = attrgetter(
    "op", "group_size", "nbytes", "clock", "exposed_measured", "prefetched", "label"
)
_TIMES = attrgetter("start_s", "duration_s", "exposed_s")
_POSITIVE = (0.0).__lt__

SHAPES_KEPT = 1024
"""Distinct shapes remembered (a job has a handful; the cache is dropped when it fills)."""


@dataclass(slots=True)
class Fold:
    """A report's collectives, folded: ``groups`` by (op, group size) in first-issue order."""

    groups: dict[tuple[str, int], Group]
    prefetched: int
    busy_s: float
    sequence: int


def union_seconds(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals [s], overlapping ones counted once."""
    if any(spans[i][0] < spans[i - 1][0] for i in range(1, len(spans))):
        spans.sort()  # reports list them in issue order, so this is rare
    return _union_of_sorted(spans)


def _union_of_sorted(spans: list[tuple[float, float]]) -> float:
    """:func:`union_seconds` of spans in order of their starts (the order of spans that start
    together does not change the sum)."""
    if not spans:
        return 0.0
    total = 0.0
    lo, hi = spans[0]
    for a, b in spans:
        if a > hi:
            total += hi - lo
            lo, hi = a, b
        elif b > hi:
            hi = b
    return total + (hi - lo)


def busy_seconds(collectives: list[Collective]) -> float:
    """Time with at least one collective in flight [s]: the union of their [start, end)
    intervals, so overlapping collectives (prefetch, bucketed reduce-scatters) count once."""
    return union_seconds(
        [(c.start_s, c.start_s + c.duration_s) for c in collectives if c.clock != "none"]
    )


def sequence_of(collectives: list[Collective], unfinished: int) -> int:
    """Hash of the step's collective sequence, the part every rank must agree on (op, size,
    label in issue order; timing left out); 0 when some were unfinished or none issued."""
    if unfinished or not collectives:
        return 0
    return _sequence_hash((c.op, c.nbytes, c.label) for c in collectives)


def _sequence_hash(issued: Iterable[tuple[str, int, str]]) -> int:
    return hash(tuple(issued)) or 1


def fold_each(collectives: list[Collective], unfinished: int) -> Fold:
    """The reference fold, one collective at a time (any shape). A collective no clock
    measured (clock "none") adds to count and bytes only: its bytes go to the volume but not to
    the busbw numerator, so busbw stays time-weighted over timed ops."""
    groups: dict[tuple[str, int], Group] = {}
    prefetched = 0
    for c in collectives:
        g = groups.get((c.op, c.group_size))
        if g is None:
            g = groups[(c.op, c.group_size)] = [0, 0, 0.0, 0.0, 0, 0, 0]
        g[0] += 1
        g[1] += c.nbytes
        if timed(c):
            g[2] += c.duration_s
            if c.duration_s > 0.0:
                g[6] += c.nbytes
            if c.exposed_measured:
                g[3] += c.exposed_s
            else:
                g[5] += 1
        else:
            g[4] += 1
            g[5] += 1
        prefetched += c.prefetched
    return Fold(groups, prefetched, busy_seconds(collectives), sequence_of(collectives, unfinished))


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a shape's figures are apart from the times (a shape with a collective untimed or
    its wait unmeasured is cached as None: the reference fold takes it)."""

    groups: tuple[tuple[tuple[str, int], int, int, Callable[[tuple[float, ...]], Any], bool], ...]
    """Per group in first-issue order: key, count, S, the getter of its members' entries of a
    per-collective list, whether that getter returns one value (a group of one)."""
    prefetched: int
    sequence: int


_shapes: dict[tuple[tuple[Any, ...], ...], _Shape | None] = {}


def _shape_of(key: tuple[tuple[Any, ...], ...]) -> _Shape | None:
    members: dict[tuple[str, int], list[int]] = {}
    nbytes: dict[tuple[str, int], int] = {}
    prefetched = 0
    for i, (op, size, size_bytes, clock, measured, ahead, _label) in enumerate(key):
        if not timed_clock(clock) or not measured:
            return None
        members.setdefault((op, size), []).append(i)
        nbytes[(op, size)] = nbytes.get((op, size), 0) + size_bytes
        prefetched += ahead
    sequence = _sequence_hash((k[0], k[2], k[6]) for k in key)
    groups = tuple(
        (g, len(idx), nbytes[g], itemgetter(*idx), len(idx) == 1) for g, idx in members.items()
    )
    return _Shape(groups, prefetched, sequence)


def fold(collectives: list[Collective], unfinished: int) -> Fold:
    """The report's collectives folded: by shape when its shape allows, else one by one; the
    same figures either way."""
    if not collectives:
        return Fold({}, 0, 0.0, 0)
    key = tuple(map(_SHAPE, collectives))
    shape = _shapes.get(key, _shapes)
    if shape is _shapes:
        if len(_shapes) >= SHAPES_KEPT:
            _shapes.clear()
        shape = _shapes[key] = _shape_of(key)
    if shape is None:
        return fold_each(collectives, unfinished)
    starts, durations, waits = zip(*map(_TIMES, collectives), strict=True)
    if not all(map(_POSITIVE, durations)):
        return fold_each(collectives, unfinished)
    assert isinstance(shape, _Shape)
    groups: dict[tuple[str, int], Group] = {}
    for g, count, size_bytes, members, single in shape.groups:
        # reduce(add, ..., 0.0): the loop's additions in its order (sum() may compensate).
        if single:
            seconds, waited = 0.0 + members(durations), 0.0 + members(waits)
        else:
            seconds = reduce(add, members(durations), 0.0)
            waited = reduce(add, members(waits), 0.0)
        groups[g] = [count, size_bytes, seconds, waited, 0, 0, size_bytes]
    spans = list(zip(starts, map(add, starts, durations)))
    spans.sort()  # a C-level pass when already in order, as reports list them
    busy = _union_of_sorted(spans)
    return Fold(groups, shape.prefetched, busy, 0 if unfinished else shape.sequence)
