"""Whether an overhead goal (a ratio ``<= 1.01``) is shown met, shown missed, or not readable
from a run's rounds. Pure Python, no timing: tests/test_bench_smoke.py runs it.

A median of per-round ratios says nothing about how sure it is: on a shared 2-core machine a
paired ratio moves by several percent round to round, so a median of 1.008 from six rounds can
come from a cost of 3 % or of nothing. The interval here is a percentile bootstrap of that
median (rounds resampled with replacement, a fixed seed, so a rerun on the same figures gives
the same interval). A goal is met only when the whole interval is at or below it, missed only
when the whole interval is above it, and a run whose A/A control (the same measurement of two
identical "off" modes) is more than ``AA_TOLERANCE`` from 1 reads nothing at all: its noise is
larger than what it would claim.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

GOAL = 1.01
AA_TOLERANCE = 0.02
LEVEL = 0.90
"""Two-sided: the interval's upper end is a one-sided 95 % bound."""
RESAMPLES = 2000


def ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a[i] / b[i] (both measured in round i)."""
    return [x / y for x, y in zip(a, b, strict=True) if y > 0]


def median_interval(
    values: Sequence[float], *, level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0
) -> tuple[float, float] | None:
    """The percentile-bootstrap interval of the median of ``values`` (None below 3 values: no
    interval worth the name)."""
    n = len(values)
    if n < 3:
        return None
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    low = medians[int(tail * (resamples - 1))]
    high = medians[int((1 - tail) * (resamples - 1) + 0.5)]
    return low, high


def verdict(
    interval: tuple[float, float] | None,
    aa: float | None,
    *,
    goal: float = GOAL,
    aa_tolerance: float = AA_TOLERANCE,
) -> str:
    """PASS: the interval lies at or below ``goal`` and the control is quiet; FAIL: the
    interval lies above it (and the control is quiet); UNREADABLE otherwise, with the reason."""
    if interval is None or aa is None:
        return "UNREADABLE: too few rounds"
    if abs(aa - 1) > aa_tolerance:
        return f"UNREADABLE: A/A {aa:.3f} is more than {aa_tolerance:.0%} from 1"
    low, high = interval
    if high <= goal:
        return "PASS"
    if low > goal:
        return "FAIL"
    return f"UNREADABLE: interval {low:.3f}-{high:.3f} straddles {goal}"
