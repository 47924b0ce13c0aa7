"""Derived communication figures, one definition for every viewer (TUI, summary, export).

Bandwidth follows the nccl-tests conventions (nccl-tests doc/PERFORMANCE.md), the figures users
compare against: for a message of S bytes moved in t seconds among n ranks,

- algbw = S / t
- busbw = algbw * 2(n-1)/n for all-reduce (a ring reduce-scatter then all-gather),
  algbw * (n-1)/n for all-gather and reduce-scatter (S is the full, gathered size),
  algbw for broadcast, reduce and point-to-point.

busbw is comparable across ops and group sizes: it is what each link carried.
"""

from __future__ import annotations

_FACTORS_2X = frozenset({"all_reduce"})
_FACTORS_1X = frozenset({"all_gather", "reduce_scatter"})


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


def wire_bytes(op: str, nbytes: int, n: int) -> float:
    """Bytes each rank sends on a ring for one op (the busbw numerator): S * bus_factor."""
    return nbytes * bus_factor(op, n)
