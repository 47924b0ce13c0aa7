"""The rank heatmap: one cell per rank, colored by a metric, for when ranks do not fit as rows
(1024 ranks are 14 lines at 80 columns). Arrows move, enter drills in, ``s`` picks the metric."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.widget import Widget

from zeroscope.state import units
from zeroscope.state.viewmodel import HEAT_METRICS, AlertRules, RankRow, heat_view

from .rank_rows import filtered
from .rank_table import RankTable

METRICS = HEAT_METRICS
LEVELS = ("green", "yellow", "dark_orange", "red")
"""Colour of each heat band (AlertRules.heat_band), coolest first."""
NA_STYLE = "grey30"


def style_of(band: int | None) -> str:
    """Colour of one cell: its band by the rules (AlertRules.heat_levels), NA grey."""
    return NA_STYLE if band is None else LEVELS[band]


def legend(cuts: tuple[float, float, float], metric: str) -> Text:
    """What each colour means for ``metric``: the heatmap's colour legend."""
    if metric == "slowness":
        marks = [f"{c:.2f}x" for c in cuts]
    elif metric == "exposed":
        marks = [f"{c:.0%}" for c in cuts]
    else:
        marks = [f"{c:.0%} of max" if i == 0 else f"{c:.0%}" for i, c in enumerate(cuts)]
    text = Text()
    labels = [f"≤{marks[0]}", f"≤{marks[1]}", f"≤{marks[2]}", f">{marks[2]}"]
    for style, label in zip(LEVELS, labels):
        text.append("██", style=style)
        text.append(f" {label}  ")
    text.append("██", style=NA_STYLE)
    text.append(" NA")
    return text


class RankHeatmap(Widget, can_focus=True):
    DEFAULT_CSS = """
    RankHeatmap { height: 1fr; min-height: 3; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move(-1)", show=False),
        Binding("right", "move(1)", show=False),  # l is the loss-scale screen
        Binding("up,k", "move_row(-1)", show=False),
        Binding("down,j", "move_row(1)", show=False),
        Binding("enter", "select", "rank"),
        Binding("s", "cycle_metric", "metric"),
    ]

    metric: reactive[str] = reactive("slowness")
    cursor: reactive[int] = reactive(0)
    filter_text: reactive[str] = reactive("")

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._rows: list[RankRow] = []
        self._shown: list[RankRow] = []
        self._per_line = 1
        self.rules = AlertRules()

    def on_resize(self) -> None:
        self.post_message(RankTable.Resized())

    def set_rows(self, rows: list[RankRow], rules: AlertRules | None = None) -> None:
        self.rules = rules or self.rules
        self._rows = sorted(rows, key=lambda r: r.rank)
        self._shown = filtered(self._rows, self.filter_text)
        self.cursor = max(0, min(self.cursor, len(self._shown) - 1))
        self.refresh()

    def watch_filter_text(self) -> None:
        self.set_rows(self._rows)

    def watch_metric(self) -> None:
        self.refresh()

    def watch_cursor(self) -> None:
        self.refresh()

    @property
    def current_rank(self) -> int | None:
        return self._shown[self.cursor].rank if 0 <= self.cursor < len(self._shown) else None

    def action_move(self, delta: int) -> None:
        if self._shown:
            self.cursor = max(0, min(len(self._shown) - 1, self.cursor + delta))

    def action_move_row(self, delta: int) -> None:
        self.action_move(delta * self._per_line)

    def action_select(self) -> None:
        rank = self.current_rank
        if rank is not None:
            self.post_message(RankTable.Selected(rank))

    def action_cycle_metric(self) -> None:
        self.metric = METRICS[(METRICS.index(self.metric) + 1) % len(METRICS)]

    def render(self) -> Text:
        width, height = max(1, self.size.width), max(2, self.size.height)
        n = len(self._shown)
        cell = 2 if n * 2 <= width * (height - 2) else 1
        self._per_line = max(1, width // cell)
        metric, cursor = self.metric, self.cursor  # reactive reads cost: once per frame
        heat = heat_view(self.rules, metric, self._shown)
        bands = heat.bands
        text = Text(no_wrap=True, overflow="crop")
        current = self._shown[self.cursor] if self._shown else None
        value = heat.values[cursor] if current else None
        shown = (
            f"{value:.2f}x"
            if self.metric == "slowness" and value is not None
            else units.percent(value)
            if self.metric == "exposed"
            else units.seconds(value)
            if self.metric == "step"
            else units.size(value)
        )
        text.append(f"{n} ranks by {self.metric}", style="bold")
        text.append(f"   r{current.rank if current else 'NA'}: {shown}\n")
        # Runs of equal color become one span: at 1024 ranks that is tens of spans, not 1024
        # (the cost of a frame is in styling spans, not in counting cells).
        run_style, run = "", ""
        for i in range(len(self._shown)):
            newline = i > 0 and i % self._per_line == 0
            style = style_of(bands[i])
            if i == cursor:
                style, glyph = f"{style} reverse", "▣" * cell
            else:
                glyph = "█" * cell
            if newline or style != run_style:
                text.append(run, style=run_style)
                run_style, run = style, ""
                if newline:
                    text.append("\n")
            run += glyph
        text.append(run, style=run_style)
        text.append("\n")
        text.append_text(legend(heat.cuts, metric))
        return text
