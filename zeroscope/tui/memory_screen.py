"""Memory: what the ZeRO formulas predict for this config against what each rank holds, part by
part. The prediction is zeroscope.state.prediction (zeroscope.state.formulas, the same formulas
``zeroscope estimate`` prints)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer

from zeroscope.state import units
from zeroscope.state.viewmodel import PartCell, memory_view

from .base import StateScreen
from .charts import PART_STYLES
from .header import ClusterHeader
from .pane import Pane

FROZEN_NOTE = (
    "P counts every parameter the rank holds, frozen ones too (whole at stages 0-2, sharded at "
    "3); G and O only the trainable ones"
)


LEVEL_STYLES = {"ok": "green", "bad": "red", "warn": "yellow", "na": ""}
"""Colour of a part's deviation by its level (AlertRules.memory_level)."""


def _deviation(cell: PartCell) -> Text:
    """The deviation in 4 cells, coloured by its level."""
    style = LEVEL_STYLES[cell.level]
    if cell.deviation is not None:
        return Text(f"{cell.deviation:+.0%}".rjust(4), style=style)
    if cell.word is not None:
        return Text(cell.word.rjust(4), style=style)
    return Text("  NA")


def _cell(cell: PartCell, compact: bool) -> Text:
    """'measured/predicted dev' (17 cells), or 'measured dev' (11) when the predicted value is
    printed once above the ranks (narrow terminals)."""
    if compact:
        text = Text(f"{units.size(cell.measured):>6} ")
    else:
        text = Text(f"{units.size(cell.measured):>6}/{units.size(cell.predicted):<6}")
    text.append_text(_deviation(cell))
    return text.append(" ")


class MemoryScreen(StateScreen):
    def __init__(self) -> None:
        super().__init__(name="memory")

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        with VerticalScroll():
            yield Pane("model states per rank: measured / predicted", self._table, id="table")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(Pane).focus()
        self.refresh_view()

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())
        self.query_one(Pane).refresh(layout=True)

    def _table(self, width: int) -> Text:
        view = memory_view(self.state)
        m = view.predicted
        text = Text(view.basis + "\n", style="dim")
        compact = width < 84
        cell = 12 if compact else 18
        head = Text(f"{'rank':<5}")
        for part in ("P", "G", "O"):
            head.append(f"{part + ' device':^{cell}}", style=PART_STYLES[part])
        head.append(f"{'host (offload)':^{cell}}")
        head.append(f"{'A':>7}", style=PART_STYLES["A"])
        head.stylize("bold")
        text.append_text(head)
        if compact:
            # Narrow: the prediction (the same for every rank, G apart where the engine says
            # each rank's) once, then measured and ±%.
            row = Text("\npred ", style="dim")
            for part, value in zip(
                "PGOH", (m.params, m.grads, m.optim, m.host_total) if m else (None,) * 4
            ):
                shown = "varies" if part == "G" and view.grads_by_rank else units.size(value)
                row.append(f"{shown:>6}{'':{cell - 6}}", style="dim")
            text.append_text(row)
        for r in view.rows:
            row = Text(f"\nr{r.rank:<4}")
            for judged in r.parts:
                row.append_text(_cell(judged, compact))
            row.append(f"{units.size(r.activations):>7}")
            if r.frozen_params:
                row.append(f"  P {units.params_size(r.params, r.frozen_params)}", style="dim")
            text.append_text(row)
        if not view.rows:
            text.append("\nwaiting for ranks…", style="dim")
        if view.any_frozen:
            text.append(f"\n{FROZEN_NOTE}", style="dim")
        text.append("\nA (activations) has no closed formula: it is measured only.", style="dim")
        return text
