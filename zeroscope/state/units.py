"""Human figures: the one formatter of every view (TUI, headless lines, ``summary``, ``estimate``,
plot axes), so a size reads the same everywhere. ``None`` always prints as NA, never 0."""

from __future__ import annotations

import math
from collections.abc import Iterable

NA = "NA"


SIZE_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")
"""Decimal units (1 GB = 1e9 bytes), as the ZeRO paper counts and DeepSpeed's estimators print."""


def params_size(nbytes: float | None, frozen: float | None) -> str:
    """P with its frozen share beside it when there is one: ``516KB (frozen 502KB)``."""
    if not frozen or nbytes is None:
        return size(nbytes)
    return f"{size(nbytes)} (frozen {size(frozen)})"


def size(nbytes: float | None) -> str:
    """``1.2GB`` style: the largest decimal unit that keeps the figure >= 1, one decimal under
    100 of it; a non-zero size never prints as 0."""
    if nbytes is None:
        return NA
    value = float(nbytes)
    for unit in SIZE_UNITS:
        if abs(value) < 999.95 or unit == SIZE_UNITS[-1]:
            if unit == "B":
                return f"{value:.0f}B"
            return f"{value:.1f}{unit}" if abs(value) < 99.95 else f"{value:.0f}{unit}"
        value /= 1000
    return NA  # pragma: no cover


def rate(bytes_per_s: float | None) -> str:
    """Bytes per second in the largest decimal unit that keeps it >= 1 (GB/s, MB/s ...)."""
    if bytes_per_s is None:
        return NA
    for scale, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s")):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.2f}{unit}"
    return f"{bytes_per_s:.0f}B/s"


def short_rate(bytes_per_s: float | None) -> str:
    """``rate`` to three significant digits (882.62MB/s -> 883MB/s): at most 8 characters, so
    a table column of 9 keeps a space before it (at 80 columns the offload figure ran into the
    exposed one: ``7%882.62MB/s``)."""
    if bytes_per_s is None:
        return NA
    for scale, unit in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "KB/s")):
        if bytes_per_s >= scale:
            value = bytes_per_s / scale
            digits = 2 if value < 9.995 else 1 if value < 99.95 else 0  # as it rounds
            return f"{value:.{digits}f}{unit}"
    return f"{bytes_per_s:.0f}B/s"


def seconds(value: float | None) -> str:
    """``150ms`` / ``2.31s``; under 10 ms with a decimal, so a short time never prints as 0."""
    if value is None:
        return NA
    if value == 0:
        return "0ms"
    if value < 1e-4:
        return f"{value * 1e6:.0f}µs"
    if value < 0.01:
        return f"{value * 1e3:.1f}ms"
    if value < 1:
        return f"{value * 1e3:.0f}ms"
    return f"{value:.2f}s"


def percent(fraction: float | None) -> str:
    return NA if fraction is None else f"{fraction * 100:.0f}%"


def number(value: float | None, fmt: str = ".3f") -> str:
    return NA if value is None else format(value, fmt)


def scale(value: float | None) -> str:
    """Loss scales are powers of two: 65536 prints whole, 0.5 keeps its fraction."""
    if value is None:
        return NA
    return f"{value:.0f}" if value >= 1 else f"{value:g}"


def scale_short(value: float | None) -> str:
    """A loss scale in a six-wide column: whole up to 999999, a larger power of two as 2^N
    (GradScaler's and DeepSpeed's scales are powers of two: 2^20 = 1048576 ran into the next
    column, 2^40 would take thirteen)."""
    if value is None or value < 1e6:
        return scale(value)
    exponent = round(math.log2(value))
    return f"2^{exponent}" if 2.0**exponent == value else count(value)


def count(value: float | None) -> str:
    """A count or a rate of them with an SI suffix: 950, 12.3k, 4.56M, 1.2G."""
    if value is None:
        return NA
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def steps(n: int) -> str:
    """ "1 step", "12 steps"."""
    return f"{n} step" if n == 1 else f"{n} steps"


def fine_percent(fraction: float | None) -> str:
    """A percentage with one decimal (MFU: a few points matter); two digits below 1%, and
    "<0.01%" below that: at most 7 characters, the rank table's MFU column (a CPU job's
    "0.00078%" ran into the loss scale beside it and read "81920.00078%")."""
    if fraction is None:
        return NA
    value = fraction * 100
    if abs(value) >= 1:
        return f"{value:.1f}%"
    if 0 < abs(value) < 0.01:
        return "<0.01%" if value > 0 else ">-0.01%"
    return f"{value:.2g}%"


def flop_rate(tflops: float | None) -> str:
    """Model FLOP/s given in TFLOP/s, with the prefix that fits: 312TFLOP/s, 52.4GFLOP/s."""
    if tflops is None:
        return NA
    value = tflops * 1e12
    for limit, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.3g}{prefix}FLOP/s"
    return f"{value:.3g}FLOP/s"


def axis_unit(values: Iterable[float | None], unit: str) -> tuple[float, str]:
    """(divisor, unit label) for a chart's axis so its largest value reads naturally: bytes as
    B..TB (decimal, as :func:`size`), seconds as ms below 2 s, else s."""
    top = max((abs(v) for v in values if v is not None), default=0.0)
    if unit == "s":
        return (1e-3, "ms") if top < 2 else (1.0, "s")
    for div, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if top >= div:
            return div, name
    return 1.0, "B"


def age(seconds: float) -> str:
    """How long ago, coarsely: ``42s`` under two minutes, ``17m`` under two hours, else ``5h``."""
    whole = max(0, int(seconds))
    if whole < 120:
        return f"{whole}s"
    if whole < 7200:
        return f"{whole // 60}m"
    return f"{whole // 3600}h"
