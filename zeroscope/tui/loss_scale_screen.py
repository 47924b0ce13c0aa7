"""Loss scale: the fp16 dynamic loss scale per step on a log2 axis (x = overflow, step
skipped), drawn by plotext with a 2^k label on the row of every power of two it shows, and the
event log (overflow, scale change, scale at minimum, nan loss)."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer
from textual_plotext.plot import Plot

from zeroscope.state import units
from zeroscope.state.viewmodel import loss_scale_view

from .base import StateScreen
from .header import ClusterHeader
from .history_plot import Chart, Line, build, legend_text
from .pane import Pane

EVENT_STYLES = {"bad": "bold red", "warn": "yellow", "ok": "cyan", "na": "dim"}
"""Colour of a loss-scale event by its level (viewmodel.EVENT_LEVELS)."""

MAX_ROWS = 9
"""Labelled levels of the chart at most, and its data rows when the scale spans so few octaves
that each gets several rows (the frame and the step labels add three)."""
MAX_OCTAVE_ROWS = 48
"""Data rows at most when the scale spans more octaves than MAX_ROWS: one row per octave, so
every power of two has a row of its own (labelled every 2nd, 4th ... octave); with nine rows
for 40 octaves a 2^40 point was drawn on the 2^41 row, 2^16 on 2^14's."""


class LossScaleScreen(StateScreen):
    def __init__(self) -> None:
        super().__init__(name="loss_scale")
        self._plot = Plot()

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        with VerticalScroll():
            yield Pane(
                "loss scale per step (log2 axis; x overflow, step skipped)", self._chart, id="chart"
            )
            yield Pane("overflow / skip / scale events (newest first)", self._events, id="events")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#chart", Pane).focus()
        self.refresh_view()

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())
        for pane in self.query(Pane):
            pane.refresh(layout=True)

    def _chart(self, width: int) -> Text:
        view = loss_scale_view(self.state)
        c = self.state.config
        if all(v is None for v in view.log2_scales):
            # fp32 parameters under fp16 autocast still report a GradScaler's scale
            if c is not None and c.precision != "fp16":
                return Text(f"{c.precision}: no loss scaling (only fp16 needs it)", style="dim")
            return Text("NA (no loss scale reported)", style="dim")
        chart, rows = loss_scale_chart(
            view.steps, view.log2_scales, view.overflow, self.zapp.cursor
        )
        text = legend_text(chart, width)
        text.append("\n")
        text.append_text(build(self._plot, chart, width, rows + 3))
        text.append(
            f"\nnow {units.scale(view.scales[-1])}; {view.skipped} of {len(view.steps)} steps "
            "skipped"
        )
        return text

    def _events(self, width: int) -> Text:
        """Newest first; a message too long for the pane ends in "…" (cut bare, "at loss scale
        524288" read "at loss scale 5")."""
        events = loss_scale_view(self.state).events
        if not events:
            return Text("no overflow or scale events", style="dim")
        text = Text()
        for i, (e, level) in enumerate(events):
            if i:
                text.append("\n")
            text.append(f"step {e.step:>6}  r{e.rank:<4} ")
            text.append(f"{e.event:<17}", style=EVENT_STYLES[level])
            text.append(_clip(e.message, max(10, width - 36)))
        return text


def loss_scale_chart(
    steps: list[int], logs: list[float | None], overflow: list[bool], cursor: int | None
) -> tuple[Chart, int]:
    """(the chart, its data rows). log2 of each scale is plotted and the axis labelled 2^k at
    integer levels; the rows are chosen so every labelled level falls exactly on a row (rows - 1
    a multiple of the levels' span), so a label sits on the row of the points with that scale,
    and past MAX_ROWS octaves every octave has a row (MAX_OCTAVE_ROWS), so no power of two is
    drawn on another's row."""
    known = [x for x in logs if x is not None]
    lo, hi = math.floor(min(known)), math.ceil(max(known))
    stride = 1
    while -(-(max(hi, lo + 1) - lo) // stride) + 1 > MAX_ROWS:
        stride *= 2  # 2^0, 2^2, 2^4 ... when the scale spans more octaves than rows
    spans = max(1, -(-(hi - lo) // stride))
    hi = lo + spans * stride
    if spans == hi - lo:  # a label on every octave
        per = max(1, (MAX_ROWS - 1) // spans)  # rows per labelled level
        rows = spans * per + 1
    elif hi - lo + 1 <= MAX_OCTAVE_ROWS:
        rows = hi - lo + 1  # a row per octave: each point on its own power's row
    else:
        rows = spans + 1
    levels = [float(lo + i * stride) for i in range(spans + 1)]
    chart = Chart(
        "loss scale (log2)",
        [Line("scale", steps, logs, "cyan", marker="dot", scatter=True, legend="•")],
        cursor=cursor,
        y_min=lo,
        y_max=hi,
        y_ticks=(levels, [f"2^{k:.0f}" for k in levels]),
    )
    over = [(s, x) for s, x, o in zip(steps, logs, overflow) if o and x is not None]
    if over:
        chart.lines.append(
            Line(
                "overflow, skipped",
                [s for s, _ in over],
                [x for _, x in over],
                "red",
                marker="x",
                scatter=True,
                legend="x ",
            )
        )
    return chart, rows


def _clip(message: str, room: int) -> str:
    """``message`` in at most ``room`` characters, cut with "…" where it does not fit, at a
    space when there is one: never inside a number, whose first digits would read as a value."""
    if len(message) <= room:
        return message
    cut = message[: room - 1]
    if message[room - 1] != " " and " " in cut:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip() + "…"
