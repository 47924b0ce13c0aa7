"""One history plot: a title line with a colour legend, then a plotext chart (textual-plotext's
``Plot``: axes, ticks, lines, fills and vertical cursor lines).

The chart is built only when its data or size changed (plotext builds in pure Python, ~10 ms a
chart plus its pixels): the built Text is cached by (data key, width, height), so a frame that
moves only the rank table costs nothing here. A series with more points than the chart has pixel
columns is thinned first (``thin``: each column keeps its lowest and highest point), so a long
series costs what its picture costs, not what its points do. A missing value (None) is a gap in
the line, never a zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import groupby

from rich.text import Text
from textual.widget import Widget
from textual_plotext.plot import Plot

Number = float | int
Values = Sequence[Number | None]


@dataclass(slots=True)
class Line:
    """One series of a chart, as drawn and as named in the legend."""

    label: str
    xs: Sequence[int]
    ys: Values
    color: str
    """A plotext colour name (the terminal's 16 colours, so every theme keeps them apart)."""
    fill: bool = False
    """Fill to the x axis (stacked areas: draw the largest first)."""
    marker: str = "braille"
    scatter: bool = False
    legend: str = "─"
    """The legend's sample glyph."""


@dataclass(slots=True)
class Chart:
    """Everything one plot shows: built by the screens from zeroscope.state, drawn here."""

    title: str
    lines: list[Line] = field(default_factory=list)
    cursor: int | None = None
    """A step to mark with a vertical line (replay's current step)."""
    y_min: float | None = 0.0
    """Lower end of the y axis (None: the data's); 0 keeps sizes and shares honest."""
    y_max: float | None = None
    y_ticks: tuple[Sequence[float], Sequence[str]] | None = None
    """Fixed ticks and labels (a log2 axis labels 2^k); None: nice ticks of the range."""
    y_format: Callable[[float], str] = field(default=lambda v: f"{v:g}")
    hline: float | None = None
    """A threshold to draw across (an alert's limit)."""
    note: str = ""
    """Shown instead of the chart when it has no data (why it is empty)."""

    def has_data(self) -> bool:
        return any(v is not None for line in self.lines for v in line.ys)


def nice_ticks(lo: float, hi: float, most: int) -> list[float]:
    """Tick positions at 1, 2 or 5 x 10^k steps inside [lo, hi]: the finest such step that
    gives at most ``most`` ticks (at least two where the range allows)."""
    if most < 2 or not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    power = 10 ** math.floor(math.log10((hi - lo) / most))
    for k in range(8):
        for m in (1, 2, 5):
            step = m * power * 10**k
            first = math.ceil(lo / step - 1e-9)
            last = math.floor(hi / step + 1e-9)
            if last - first + 1 <= most:
                return [round(i * step, 12) for i in range(first, last + 1)] or [lo]
    return [lo]  # pragma: no cover


def tick_labels(ticks: Sequence[float], fmt: Callable[[float], str]) -> list[str]:
    """The ticks in the chart's format; where two would read alike (a loss moving between
    5.548 and 5.552 in three digits: "5.55" twice), with as many digits as tell them apart."""
    labels = [fmt(v) for v in ticks]
    for digits in range(4, 13):
        if len(set(labels)) == len(labels):
            break
        labels = [f"{v:.{digits}g}" for v in ticks]
    return labels


def _runs(xs: Sequence[int], ys: Values) -> list[tuple[list[int], list[float]]]:
    """Contiguous runs of known values: a None splits the line (a gap, not a zero)."""
    runs: list[tuple[list[int], list[float]]] = []
    cur_x: list[int] = []
    cur_y: list[float] = []
    for x, y in zip(xs, ys):
        if y is None or (isinstance(y, float) and not math.isfinite(y)):
            if cur_x:
                runs.append((cur_x, cur_y))
            cur_x, cur_y = [], []
        else:
            cur_x.append(x)
            cur_y.append(float(y))
    if cur_x:
        runs.append((cur_x, cur_y))
    return runs


def thin(
    runs: list[tuple[list[int], list[float]]], x_lo: int, x_hi: int, columns: int
) -> list[tuple[list[int], list[float]]]:
    """The runs with at most two points per column of ``columns`` equal slices of [x_lo, x_hi]:
    the column's lowest and highest, the one nearer the line's last point first. With columns
    at least the chart's pixel columns, the line through them covers what the line through
    every point covers: each column's span, joined to the next (plotext rasterises every
    segment pixel by pixel in Python, so a noisy series of 500 points drawing each swing over
    and over costs ~5x the same picture from its extremes). Runs of at most 2 x columns
    points in all are returned unchanged; a gap narrower than a column closes (it would not
    show)."""
    if sum(len(xs) for xs, _ in runs) <= 2 * columns:
        return runs
    span = x_hi - x_lo + 1
    out: list[tuple[list[int], list[float]]] = []
    cur_x: list[int] = []
    cur_y: list[float] = []
    last = None
    points = ((x, y) for xs, ys in runs for x, y in zip(xs, ys))
    for col, group in groupby(points, key=lambda p: (p[0] - x_lo) * columns // span):
        g = list(group)
        low, high = min(g, key=lambda p: p[1]), max(g, key=lambda p: p[1])
        if last is not None and col > last + 1 and cur_x:
            out.append((cur_x, cur_y))
            cur_x, cur_y = [], []
        if cur_y and abs(cur_y[-1] - high[1]) < abs(cur_y[-1] - low[1]):
            low, high = high, low  # enter the column from the side the line comes from
        for x, y in (low, high) if low != high else (low,):
            cur_x.append(x)
            cur_y.append(y)
        last = col
    if cur_x:
        out.append((cur_x, cur_y))
    return out


def thin_marks(
    runs: list[tuple[list[int], list[float]]],
    x_lo: int,
    x_hi: int,
    columns: int,
    y_lo: float,
    y_hi: float,
    rows: int,
) -> list[tuple[list[int], list[float]]]:
    """Scattered marks with one kept per cell of a ``columns`` x ``rows`` grid over the axes
    (marks drawn on the same cell are one mark); at most 4 x columns marks pass unchanged."""
    if sum(len(xs) for xs, _ in runs) <= 4 * columns:
        return runs
    span, height = x_hi - x_lo + 1, (y_hi - y_lo) or 1.0
    seen: dict[tuple[int, int], tuple[int, float]] = {}
    for xs, ys in runs:
        for x, y in zip(xs, ys):
            cell = ((x - x_lo) * columns // span, int((y - y_lo) * rows / height))
            seen.setdefault(cell, (x, y))
    kept = sorted(seen.values())
    return [([x for x, _ in kept], [y for _, y in kept])]


def legend_text(chart: Chart, width: int) -> Text:
    """The title, then each series' glyph in its colour and its name, cut to ``width``."""
    text = Text(chart.title, style="bold", no_wrap=True, overflow="ellipsis")
    for line in chart.lines:
        text.append(" ")
        text.append(line.legend, style=line.color)
        text.append(line.label)
    if chart.cursor is not None:
        text.append(" ")
        text.append("│", style="bold white")
        text.append(f" step {chart.cursor}")
    text.truncate(width, overflow="ellipsis")
    return text


def build(plt: Plot, chart: Chart, width: int, height: int) -> Text:
    """The chart drawn by plotext into ``width`` x ``height`` cells, as Rich Text.

    ``plt`` is reused from build to build: only its data is cleared, and every setting used
    here (theme, size, frame, limits, ticks) is set again below, so the rest of the figure is
    kept (``clear_figure`` rebuilds it: a terminal-size probe and deep copies, a quarter of a
    small chart's time)."""
    plt.clear_data()
    plt.theme("clear")
    plt.plotsize(width, height)
    plt.frame(True)
    xs_all = [x for line in chart.lines for x, y in zip(line.xs, line.ys) if y is not None]
    ys_all = [float(y) for line in chart.lines for y in line.ys if y is not None]
    if chart.cursor is not None:
        xs_all.append(chart.cursor)
    x_lo, x_hi = min(xs_all), max(xs_all)
    if x_hi == x_lo:
        x_hi = x_lo + 1
    y_lo = chart.y_min if chart.y_min is not None else min(ys_all)
    y_hi = chart.y_max if chart.y_max is not None else max([*ys_all, y_lo])
    if chart.hline is not None:
        y_hi = max(y_hi, chart.hline)
    if y_hi <= y_lo:
        y_hi = y_lo + (abs(y_lo) or 1.0)
    elif chart.y_max is None:
        y_hi += (y_hi - y_lo) * 0.05  # headroom: the top line is not drawn on the frame
    for line in chart.lines:
        # Braille draws 2 pixel columns a cell, block markers 1: never fewer columns than shown.
        columns = width * (2 if line.marker == "braille" else 1)
        runs = _runs(line.xs, line.ys)
        if line.scatter:
            runs = thin_marks(runs, x_lo, x_hi, columns, y_lo, y_hi, height * 4)
        else:
            runs = thin(runs, x_lo, x_hi, columns)
        for xs, ys in runs:
            if line.scatter:
                plt.scatter(xs, ys, marker=line.marker, color=line.color)
            else:
                plt.plot(xs, ys, marker=line.marker, color=line.color, fillx=line.fill)
    if chart.hline is not None:
        plt.hline(chart.hline, "red")
    if chart.cursor is not None:
        plt.vline(chart.cursor, "white")
    plt.xlim(x_lo, x_hi)
    plt.ylim(y_lo, y_hi)
    plot_rows = max(1, height - 3)  # frame top, frame bottom, tick labels
    if chart.y_ticks is not None:
        plt.yticks(list(chart.y_ticks[0]), list(chart.y_ticks[1]))
    else:
        yt = nice_ticks(y_lo, y_hi, max(2, min(5, plot_rows // 2 + 1)))
        plt.yticks(yt, tick_labels(yt, chart.y_format))
    xt = [t for t in nice_ticks(x_lo, x_hi, max(2, width // 10)) if t == int(t)]
    plt.xticks(xt, [str(int(t)) for t in xt])
    return Text.from_ansi(plt.build(), no_wrap=True, overflow="crop")


class HistoryPlot(Widget):
    """A chart that redraws from ``chart()`` when its ``data_key`` or its size changed."""

    DEFAULT_CSS = """
    HistoryPlot { height: 1fr; width: 1fr; min-height: 5; }
    """

    def __init__(
        self,
        chart: Callable[[], Chart],
        *,
        drawn: Callable[[HistoryPlot], None] | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self._chart = chart
        self._drawn = drawn
        """Told, from inside the paint, each time this plot has been drawn."""
        self.data_key: object = None
        """Which data this plot shows (HistoryPlots hands each plot the newest in turn)."""
        self.handed = 0
        """When it was handed (HistoryPlots' count): the oldest goes first."""
        self._plot = Plot()
        self._cache: tuple[object, Text] | None = None
        self.builds = 0
        """Charts built so far (tests and the bench read it: a cached frame builds none)."""

    def render(self) -> Text:
        if self._drawn is not None:
            self._drawn(self)
        width, height = self.size.width, self.size.height
        if width < 10 or height < 3:
            return Text("")
        key = (self.data_key, width, height)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        chart = self._chart()
        text = legend_text(chart, width)
        text.append("\n")
        if chart.has_data():
            text.append_text(build(self._plot, chart, width, height - 1))
        else:
            text.append(chart.note or "NA: nothing reported yet", style="dim")
        self.builds += 1
        self._cache = (key, text)
        return text
