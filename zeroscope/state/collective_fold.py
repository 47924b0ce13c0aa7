"""One report's collectives folded into the step's communication figures: per (op, group size)
the count, bytes, time, wait and the untimed / unexposed counts, the busy time and the sequence
fingerprint (zeroscope.state.rank.summarize turns them into OpTotals and a StepSummary).

Tried and not kept: folding each distinct *shape* of the list once (ops, sizes, groups, clocks,
labels) and reading a report's times through C-level ``map`` / ``itemgetter`` calls. Equal to
the last bit, but building and hashing the shape key (seven attributes a collective) cost
about what the loop saved: 0.87-1.26x the loop on 18-collective reports at load 6-28 (docs/
bench.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from zeroscope.agent.schema import Collective

Group = list[Any]
"""[count, S, seconds, waited, untimed, unexposed, S of the collectives with a time > 0]: ints but
for seconds and waited (floats from the start, so a group with nothing timed sums to 0.0). A
list, not a struct: the per-collective loop adds to its items (the cheapest update in CPython)."""


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


_ENCODE = msgspec.msgpack.Encoder().encode


def sequence_of(collectives: list[Collective], unfinished: int) -> int:
    """Fingerprint of the step's collective sequence, the part every rank must agree on (op,
    size, label in issue order; timing left out); 0 when some were unfinished or none issued.

    The same in every process (a 56-bit BLAKE2b of the sequence's msgpack): a node's relay
    makes it for its ranks and the viewer for ranks that report to it directly, and the two
    are compared. Python's ``hash`` of the tuple (~1.9 us for 18 collectives, against ~3.4 us
    for this) is salted per process."""
    if unfinished or not collectives:
        return 0
    key = _ENCODE([(c.op, c.nbytes, c.label) for c in collectives])
    return int.from_bytes(blake2b(key, digest_size=7).digest(), "big") or 1


def fold(collectives: list[Collective], unfinished: int) -> Fold:
    """The report's collectives, one at a time. A collective no clock measured (clock "none")
    adds to count and bytes only: its bytes go to the volume but not to the busbw numerator, so
    busbw stays time-weighted over timed ops.

    The busy time's union is swept in the same pass (the timed spans in issue order, as
    :func:`union_seconds` sweeps them, the same additions in the same order); a report whose
    timed starts go backwards gets :func:`busy_seconds` instead (it sorts them). A separate
    pass over the list and its spans cost ~3 us of a ~10 us fold."""
    groups: dict[tuple[str, int], Group] = {}
    get = groups.get
    prefetched = 0
    total = lo = hi = start = 0.0
    spans = 0  # timed collectives seen
    in_order = True
    for c in collectives:
        g = get((c.op, c.group_size))
        if g is None:
            g = groups[(c.op, c.group_size)] = [0, 0, 0.0, 0.0, 0, 0, 0]
        nbytes = c.nbytes
        g[0] += 1
        g[1] += nbytes
        if c.clock != "none":  # bandwidth.timed, written out
            d = c.duration_s
            g[2] += d
            if d > 0.0:
                g[6] += nbytes
            if c.exposed_measured:
                g[3] += c.exposed_s
            else:
                g[5] += 1
            a = c.start_s
            b = a + d
            if not spans:
                lo, hi = a, b
            elif a < start:
                in_order = False
            start = a
            spans += 1
            if a > hi:
                total += hi - lo
                lo, hi = a, b
            elif b > hi:
                hi = b
        else:
            g[4] += 1
            g[5] += 1
        prefetched += c.prefetched
    if not in_order:
        return Fold(
            groups, prefetched, busy_seconds(collectives), sequence_of(collectives, unfinished)
        )
    busy = total + (hi - lo) if spans else 0.0
    return Fold(groups, prefetched, busy, sequence_of(collectives, unfinished))
