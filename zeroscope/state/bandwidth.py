"""Per-collective figures: bandwidth and volume, one definition for every view.

Bandwidth follows the nccl-tests conventions (nccl-tests doc/PERFORMANCE.md), the figures users
compare against: for a message of S bytes (``Collective.nbytes``: the full, gathered size for
all-gather and reduce-scatter, the buffer for all-reduce) moved in t seconds among n ranks,

- algbw = S / t                                                       [bytes/s]
- busbw = algbw * 2(n-1)/n for all-reduce (a ring reduce-scatter then all-gather),
  algbw * (n-1)/n for all-gather, reduce-scatter, gather and scatter (S: the whole gathered or
  scattered size) and all-to-all (S: what each rank sends, of which 1/n stays on the rank),
  algbw for broadcast, reduce and point-to-point                      [bytes/s]

busbw is comparable across ops and group sizes: it is what each link carried. Over many
collectives it is time-weighted: sum(S * factor) / sum(t) (:func:`busbw_of`).

Communication *volume* is the ZeRO paper's accounting (section 7), the one the 2Ψ / 3Ψ
formulas use: an all-reduce of S bytes is a reduce-scatter plus an all-gather of S bytes each,
so it counts 2S; every other op counts S [bytes]. Every "comm bytes" figure zeroscope shows
(per step, per op, per rank, per run) is this volume.

This module lived in ``agent/metrics.py`` before derived figures moved to zeroscope/state/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zeroscope.agent.schema_summary import busbw_of as busbw_of

if TYPE_CHECKING:
    from zeroscope.agent.schema import Collective

_FACTORS_2X = frozenset({"all_reduce"})
_FACTORS_1X = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"})


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw/algbw ratio for ``op`` among ``n`` ranks."""
    if n < 1:
        raise ValueError(f"group size must be >= 1, got {n}")
    if op in _FACTORS_2X:
        return 2.0 * (n - 1) / n
    if op in _FACTORS_1X:
        return (n - 1) / n
    return 1.0


def algbw(nbytes: int, seconds: float) -> float | None:
    """Algorithm bandwidth in bytes/s; None when the time is not positive (not measurable)."""
    if seconds <= 0:
        return None
    return nbytes / seconds


def busbw(op: str, nbytes: int, seconds: float, n: int) -> float | None:
    """Bus bandwidth in bytes/s (nccl-tests convention); None when not measurable."""
    bw = algbw(nbytes, seconds)
    return None if bw is None else bw * bus_factor(op, n)


def wire_factor(op: str, n: int) -> float:
    """Wire bytes per byte of S for ``op`` among ``n`` ranks: the bus factor, a group size not
    reported (0) counting as one rank. :func:`wire_bytes` is S times this."""
    return bus_factor(op, max(1, n))


def wire_bytes(op: str, nbytes: float, n: int) -> float:
    """Bytes each rank sends on a ring for one op (the busbw numerator): S * bus_factor. A group
    size not reported (0) counts as one rank. Every busbw figure (per op, per step, per run, the
    advisor's link rate) sums this numerator (a report's fold multiplies each (op, group size)'s
    summed S by :func:`wire_factor`: the same product)."""
    return nbytes * wire_factor(op, n)


def volume(op: str, nbytes: int) -> int:
    """A collective's communication volume in bytes (ZeRO paper section 7): 2S for an
    all-reduce (reduce-scatter + all-gather), S for every other op."""
    return 2 * nbytes if op == "all_reduce" else nbytes


def timed(c: Collective) -> bool:
    """Whether a clock measured ``c``'s duration (``Collective.clock`` is not ``none``): only
    then are its duration and busbw figures; otherwise it counts for bytes and count alone."""
    return c.clock != "none"


def duration_of(c: Collective) -> float | None:
    """``c``'s issue-to-completion time [s]; NA when no clock measured it."""
    return c.duration_s if c.clock != "none" else None


def exposed_of(c: Collective) -> float | None:
    """The time the loop waited for ``c`` [s]; NA when that wait was not measured."""
    return c.exposed_s if c.exposed_measured and c.clock != "none" else None


def collective_busbw(c: Collective) -> float | None:
    """``c``'s bus bandwidth [bytes/s]; NA when its duration was not measured."""
    return busbw(c.op, c.nbytes, c.duration_s, c.group_size) if c.clock != "none" else None
