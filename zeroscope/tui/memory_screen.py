"""Memory: what the ZeRO formulas predict for this config against what each rank holds, part by
part. The prediction is zeroscope.state.prediction (zeroscope.state.formulas, the same formulas
``zeroscope estimate`` prints)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer

from zeroscope.state import units
from zeroscope.state.viewmodel import AlertRules, deviation, predicted_memory

from .base import StateScreen
from .charts import PART_STYLES
from .header import ClusterHeader
from .pane import Pane

FROZEN_NOTE = (
    "P counts every parameter the rank holds, frozen ones too (whole at stages 0-2, sharded at "
    "3); G and O only the trainable ones"
)


def _deviation(rules: AlertRules, measured: float | None, expected: float | None) -> Text:
    """The deviation in 4 cells, coloured by its level (AlertRules.memory_level)."""
    dev = deviation(measured, expected)
    if dev is not None:
        bad = rules.memory_level(dev) == "bad"
        return Text(f"{dev:+.0%}".rjust(4), style="red" if bad else "green")
    if measured is not None and expected == 0:
        return Text(" new" if measured else "  ok", style="red" if measured else "green")
    return Text("  NA")


def _cell(rules: AlertRules, measured: float | None, expected: float | None, compact: bool) -> Text:
    """'measured/predicted dev' (17 cells), or 'measured dev' (11) when the predicted value is
    printed once above the ranks (narrow terminals)."""
    if compact:
        text = Text(f"{units.size(measured):>6} ")
    else:
        text = Text(f"{units.size(measured):>6}/{units.size(expected):<6}")
    text.append_text(_deviation(rules, measured, expected))
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
        m, why = predicted_memory(self.state)
        text = Text(why + "\n", style="dim")
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
            # Narrow: the prediction (the same for every rank) once, then measured and ±%.
            row = Text("\npred ", style="dim")
            for value in (m.params, m.grads, m.optim, m.host_total) if m else (None,) * 4:
                row.append(f"{units.size(value):>6}{'':{cell - 6}}", style="dim")
            text.append_text(row)
        for r, rs in sorted(self.state.ranks.items()):
            s = rs.summary
            row = Text(f"\nr{r:<4}")
            parts = [
                (s.params if s else None, m.params if m else None),
                (s.grads if s else None, m.grads if m else None),
                (s.optim if s else None, m.optim if m else None),
                (s.host_bytes if s else None, m.host_total if m else None),
            ]
            for measured, expected in parts:
                row.append_text(_cell(self.state.rules, measured, expected, compact))
            row.append(f"{units.size(s.activations if s else None):>7}")
            if s is not None and s.frozen_params:
                row.append(f"  P {units.params_size(s.params, s.frozen_params)}", style="dim")
            text.append_text(row)
        if not self.state.ranks:
            text.append("\nwaiting for ranks…", style="dim")
        if any(rs.summary and rs.summary.frozen_params for rs in self.state.ranks.values()):
            text.append(f"\n{FROZEN_NOTE}", style="dim")
        text.append("\nA (activations) has no closed formula: it is measured only.", style="dim")
        return text
