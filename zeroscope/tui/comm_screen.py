"""Communication: volume per step against the engine's traffic model for the config
(zeroscope.state.prediction; the paper's 2Ψ / 3Ψ beside it), bus bandwidth per op over time
(nccl-tests convention), and the share of the step left exposed. Figures come from
zeroscope.state; this screen only formats them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer

from zeroscope.state import units
from zeroscope.state.viewmodel import (
    busbw_series,
    paper_differences,
    predicted_traffic,
    volume_series,
)

from .base import StateScreen
from .charts import sparkline
from .header import ClusterHeader
from .pane import Pane
from .rank_screen import LANES


class CommScreen(StateScreen):
    def __init__(self) -> None:
        super().__init__(name="comm")

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        with VerticalScroll():
            yield Pane("volume per step vs the engine's traffic model", self._volume, id="volume")
            yield Pane("bus bandwidth per op (median rank)", self._busbw, id="busbw")
            yield Pane(
                "exposed communication, share of the step (least-exposed rank)",
                self._exposed,
                id="exposed",
            )
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#volume", Pane).focus()
        self.refresh_view()

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())
        for pane in self.query(Pane):
            pane.refresh(layout=True)

    def _volume(self, width: int) -> Text:
        series = volume_series(self.state)
        expected = predicted_traffic(self.state)
        last = series[-1] if series else None
        text = Text(f"last step {units.size(last)} per rank; ")
        if expected is None:
            text.append("prediction NA")
        else:
            text.append(f"predicted {units.size(expected.volume)}")
            ratio = expected.ratio(last)
            if ratio is not None:
                met = self.state.rules.traffic_level(ratio) == "ok"
                text.append(f" ({ratio:.2f}x)", style="green" if met else "yellow")
            text.append(f"\n{expected.label}; paper {units.size(expected.paper)}", style="dim")
            of_paper = expected.paper_ratio(last)
            if of_paper is not None:
                text.append(f" ({of_paper:.2f}x of it)", style="dim")
            c, p = self.state.config, self.state.params
            reasons = paper_differences(c, p) if c is not None and p is not None else []
            text.append(
                "\nratio = measured / predicted (1.00x: the traffic model met exactly); "
                + (
                    "the paper's figure differs here: " + "; ".join(reasons)
                    if reasons
                    else "the paper's figure is the same for this config"
                ),
                style="dim",
            )
        text.append("\n")
        text.append_text(sparkline(series, max(8, width - 2), lo=0, style="cyan"))
        return text

    def _busbw(self, width: int) -> Text:
        text = Text()
        for op, style in LANES:
            series = busbw_series(self.state, op)
            if all(v is None for v in series):
                continue
            if text:
                text.append("\n")
            text.append(f"{op:<15}{units.rate(series[-1]):>11} ", style=style)
            text.append_text(sparkline(series, max(8, width - 28), lo=0, style=style))
        return text or Text("no collectives reported", style="dim")

    def _exposed(self, width: int) -> Text:
        series = [a.exposed_share for a in self.state.complete_steps()]
        last = series[-1] if series else None
        limit = self.state.rules.exposed_max
        text = Text(
            f"last {units.percent(last)} (alert above {limit:.0%})  ",
            style="bold red" if last and last > limit else "",
        )
        text.append_text(sparkline(series, max(8, width - 30), lo=0, hi=1, style="magenta"))
        return text
