"""Loss scale: the fp16 dynamic loss scale per step on a log2 axis (✗ = overflow, step
skipped) and the event log (overflow, scale change, scale at minimum, nan loss)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer

from zeroscope.state import units

from .base import StateScreen
from .charts import log2_chart
from .header import ClusterHeader
from .pane import Pane

SCALE_EVENTS = ("overflow", "scale_change", "scale_at_minimum", "nan_loss")


class LossScaleScreen(StateScreen):
    def __init__(self) -> None:
        super().__init__(name="loss_scale")

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        with VerticalScroll():
            yield Pane(
                "loss scale per step (log2 axis; ✗ overflow, step skipped)", self._chart, id="chart"
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
        steps = self.state.complete_steps()
        c = self.state.config
        if c is not None and c.precision != "fp16":
            return Text(f"{c.precision}: no loss scaling (only fp16 needs it)", style="dim")
        scales = [a.loss_scale for a in steps]
        if all(s is None for s in scales):
            return Text("NA (no loss scale reported)", style="dim")
        cols = max(8, width - 8)
        rows = log2_chart(scales, cols, 6, [a.overflow for a in steps])
        text = Text("\n").join(rows)
        shown = steps[-cols:]
        text.append(
            f"\n{'step':>6} {shown[0].step:<{max(1, cols - 8)}}{shown[-1].step:>8}", style="dim"
        )
        skipped = sum(1 for a in steps if a.skipped)
        text.append(f"\nnow {units.scale(scales[-1])}; {skipped} of {len(steps)} steps skipped")
        return text

    def _events(self, width: int) -> Text:
        events = [e for e in self.state.events if e.event in SCALE_EVENTS]
        if not events:
            return Text("no overflow or scale events", style="dim")
        text = Text()
        for i, e in enumerate(reversed(events[-200:])):
            if i:
                text.append("\n")
            style = (
                "bold red"
                if e.event in ("scale_at_minimum", "nan_loss")
                else ("yellow" if e.event == "overflow" else "cyan")
            )
            text.append(f"step {e.step:>6}  r{e.rank:<4} ")
            text.append(f"{e.event:<17}", style=style)
            text.append(f"{e.message}"[: max(10, width - 36)])
        return text
