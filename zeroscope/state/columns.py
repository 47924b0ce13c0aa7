"""One figure of every rank in a step, as an array: the step's close reads each in one C-level
pass and works on the arrays, where a Python loop over 16,384 ranks' summaries costs ~1 us a
rank per line of its body (the view's ingest goal at 16,384 ranks is 100 ms a step).

Every function here returns the value the Python it replaces returned, to the last bit: the
same IEEE operations element by element, a median that is the same two middle values' mean
(``statistics.median``), a stable sort (so 0.0 and -0.0 keep their order, as ``sorted`` keeps
it). NaN sorts nowhere, so where NaN matters the callers fall back to their Python path.

numpy is imported on first use: a viewer that never closes a step (``zeroscope --help``, a
summary of a short trace) does not pay its ~90 ms import.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Floats = npt.NDArray[np.float64]


def _np() -> Any:
    import numpy

    return numpy


def floats(values: Collection[Any], read: Callable[[Any], float]) -> Floats:
    """``read`` of each of ``values`` (a float or an int each, never None) as float64."""
    np = _np()
    return np.fromiter(map(read, values), dtype=np.float64, count=len(values))


def has_nan(a: Floats) -> bool:
    return bool(_np().isnan(a).any())


def sort(a: Floats) -> Floats:
    """``sorted`` of the values: stable, so equal values (0.0 and -0.0) keep their order."""
    return _np().sort(a, kind="stable")


def median(a: Floats) -> float:
    """``statistics.median`` of the values, bit for bit: the middle one, or the two middle
    ones' sum halved. NaN sorts nowhere (``sorted`` leaves it where the order of the others
    puts it), so with NaN in ``a`` this is ``statistics.median`` itself."""
    n = len(a)
    if n == 0:
        raise statistics.StatisticsError("no median for empty data")
    if has_nan(a):
        return statistics.median(a.tolist())
    i = n // 2
    part = _np().partition(a, (i - 1, i) if n > 1 else i)
    lo, hi = part[i - 1].item(), part[i].item()
    if lo == 0.0 or hi == 0.0:
        # partition is not stable: which of 0.0 and -0.0 lands in the middle is the sort's
        part = sort(a)
        lo, hi = part[i - 1].item(), part[i].item()
    return hi if n % 2 else (lo + hi) / 2
