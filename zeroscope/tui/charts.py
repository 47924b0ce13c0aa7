"""Text charts as Rich Text: stacked memory bars, sparklines, a timeline.

Pure functions of their inputs (no clocks, no widget state), so snapshots are reproducible and
the 1024-rank frame stays cheap. A missing value (None) is drawn as a gap, never as zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

PART_STYLES = {"P": "bold blue", "G": "bold green", "O": "bold yellow", "A": "bold magenta"}
"""P (16-bit params), G (grads), O (fp32 master + Adam m, v), A (activations)."""

SPARKS = "▁▂▃▄▅▆▇█"


def legend() -> Text:
    text = Text()
    for part, style in PART_STYLES.items():
        text.append("█", style=style)
        text.append(f"{part} ")
    return text


def stacked_bar(parts: Sequence[tuple[str, float | None]], scale: float, width: int) -> Text:
    """One bar of ``width`` cells: each part's share of ``scale`` bytes, in PART_STYLES colors.
    Cells are assigned by cumulative rounding so the bar's length is exact; a part that holds
    bytes but rounds to no cell gets one, taken from the largest part, so a small P beside
    large activations still shows its colour."""
    if scale <= 0 or width <= 0:
        return Text(" " * max(width, 0))
    known = [(part, value) for part, value in parts if value is not None]
    cells: list[int] = []
    acc = 0.0
    used = 0
    for _part, value in known:
        acc += value
        end = min(width, round(acc / scale * width))
        cells.append(max(0, end - used))
        used = max(used, end)
    for i, (_part, value) in enumerate(known):
        if value > 0 and cells[i] == 0:
            donor = max(range(len(cells)), key=lambda k: cells[k])
            if cells[donor] > 1:
                cells[donor] -= 1
                cells[i] = 1
    text = Text()
    for (part, _value), n in zip(known, cells):
        if n:
            text.append("█" * n, style=PART_STYLES.get(part, ""))
    text.append(" " * (width - sum(cells)))
    return text


def sparkline(
    values: Sequence[float | None],
    width: int,
    lo: float | None = None,
    hi: float | None = None,
    style: str = "",
) -> Text:
    """The last ``width`` values as block characters; None is a gap."""
    values = list(values)[-width:] if width > 0 else []
    known = [v for v in values if v is not None]
    text = Text(style=style)
    if not known:
        return Text("NA".ljust(width))
    low = min(known) if lo is None else lo
    high = max(known) if hi is None else hi
    span = high - low
    for v in values:
        if v is None:
            text.append(" ")
        else:
            level = 0 if span <= 0 else int((v - low) / span * (len(SPARKS) - 1) + 0.5)
            text.append(SPARKS[max(0, min(len(SPARKS) - 1, level))])
    text.append(" " * (width - len(values)))
    return text


def timeline(
    spans: Sequence[tuple[float, float, float]], total: float, width: int, style: str
) -> Text:
    """One lane of (start, duration, exposed) spans over [0, total] seconds: hidden time as a
    thin bar, exposed time (the loop waited) as a full block."""
    cells = [" "] * width
    styles = [""] * width
    if total <= 0 or width <= 0:
        return Text(" " * max(width, 0))
    for start, duration, exposed in spans:
        a = max(0, min(width - 1, int(start / total * width)))
        b = max(a + 1, min(width, math.ceil((start + duration) / total * width)))
        e = b - round(exposed / total * width) if exposed > 0 else b
        for i in range(a, b):
            full = i >= e
            if cells[i] != "█":
                cells[i] = "█" if full else "▬"
                styles[i] = style if full else f"dim {style}"
    text = Text()
    for ch, st in zip(cells, styles):
        text.append(ch, style=st)
    return text
