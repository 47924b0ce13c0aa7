"""zeroscope/state/columns.py: the step's close works on arrays, and must answer what the Python
it replaced answered, to the last bit (a median that moved by an ulp would move a standing, a
flag, a plotted point). The independent answer is the standard library's ``statistics.median``
and ``sorted`` over the same values."""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest

from zeroscope.state import columns


def _same(a: float, b: float) -> bool:
    """Equal to the bit: the same repr (so 0.0 is not -0.0), NaN equal to NaN."""
    return repr(a) == repr(b) or (math.isnan(a) and math.isnan(b))


def _cases(rng: random.Random) -> list[list[float]]:
    out = []
    for n in (1, 2, 3, 4, 5, 16, 17, 1000, 1001):
        out.append([rng.uniform(0, 1) for _ in range(n)])
        out.append([rng.choice([0.1, 0.2, 0.3]) for _ in range(n)])  # many ties
        out.append([rng.choice([0.0, -0.0, 1e-300, -1e-300]) for _ in range(n)])  # signed zeros
        out.append([rng.choice([0.0, -0.0, 5.0, -5.0]) for _ in range(n)])
        out.append([rng.uniform(-1, 1) * 10 ** rng.randint(-300, 300) for _ in range(n)])
    return out


def test_median_is_statistics_median_to_the_bit() -> None:
    rng = random.Random(7)
    for values in _cases(rng):
        want = statistics.median(values)
        got = columns.median(np.array(values))
        assert _same(got, want), (values[:8], got, want)
        assert type(got) is float


def test_median_with_nan_is_statistics_median_of_the_same_order() -> None:
    """NaN sorts nowhere: the answer depends on where it stands, as it does for ``sorted``."""
    rng = random.Random(3)
    for n in (2, 3, 6, 7, 40):
        for _ in range(20):
            values = [rng.uniform(0, 1) for _ in range(n)]
            values[rng.randrange(n)] = float("nan")
            assert _same(columns.median(np.array(values)), statistics.median(values))


def test_median_of_nothing_raises_as_statistics_does() -> None:
    with pytest.raises(statistics.StatisticsError):
        columns.median(np.array([], dtype=np.float64))


def test_sort_keeps_equal_values_in_their_order_as_sorted_does() -> None:
    rng = random.Random(11)
    for values in _cases(rng):
        got = columns.sort(np.array(values)).tolist()
        assert [repr(v) for v in got] == [repr(v) for v in sorted(values)]


def test_floats_reads_each_value_once_in_order() -> None:
    class Row:
        def __init__(self, v: float) -> None:
            self.v = v

    rows = [Row(0.5), Row(-0.0), Row(3)]
    got = columns.floats(rows, lambda r: r.v)
    assert got.dtype == np.float64
    assert [repr(v) for v in got.tolist()] == ["0.5", "-0.0", "3.0"]
