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
from zeroscope.state.viewmodel import CommView, comm_view

from .base import StateScreen
from .charts import sparkline
from .header import ClusterHeader
from .pane import Pane
from .rank_screen import LANES

LEVEL_STYLES = {"ok": "green", "warn": "yellow", "bad": "bold red", "na": "dim"}
"""Colour of the volume ratio by its level (AlertRules.traffic_level)."""


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

    def _view(self) -> CommView:
        return comm_view(self.state, (op for op, _ in LANES))

    def _volume(self, width: int) -> Text:
        view = self._view()
        expected = view.predicted
        text = Text(f"last step {units.size(view.last_volume)} per rank")
        for op, moved in view.outside_model.items():
            text.append(f" ({op} {units.size(moved)} of it: the model's token routing)")
        text.append("; ")
        if expected is None:
            text.append("prediction NA")
        else:
            text.append(f"predicted {units.size(expected.volume)}")
            if view.ratio is not None:
                text.append(f" ({view.ratio:.2f}x)", style=LEVEL_STYLES[view.ratio_level])
            text.append(f"\n{expected.label}; paper {units.size(expected.paper)}", style="dim")
            if view.paper_ratio is not None:
                text.append(f" ({view.paper_ratio:.2f}x of it)", style="dim")
            reasons = view.differences
            text.append(
                "\nratio = measured / predicted (1.00x: the traffic model met exactly"
                + ("; all-to-all left out of both" if view.outside_model else "")
                + "); "
                + (
                    "the paper's figure differs here: " + "; ".join(reasons)
                    if reasons
                    else "the prediction and the paper's figure agree for this config"
                ),
                style="dim",
            )
        text.append("\n")
        text.append_text(sparkline(view.volume, max(8, width - 2), lo=0, style="cyan"))
        return text

    def _busbw(self, width: int) -> Text:
        text = Text()
        view = self._view()
        for op, style in LANES:
            series = view.busbw.get(op)
            if series is None:
                continue
            if text:
                text.append("\n")
            value, ago = view.busbw_last[op]
            text.append(f"{op:<15}{units.rate(value):>11} ", style=style)
            old = f"{units.steps(ago)} ago " if ago else ""
            text.append(old, style="dim")
            text.append_text(sparkline(series, max(8, width - 28 - len(old)), lo=0, style=style))
        return text or Text(view.busbw_none, style="dim")

    def _exposed(self, width: int) -> Text:
        view = self._view()
        text = Text(
            f"last {units.percent(view.exposed_last)} (alert above {view.exposed_limit:.0%})  ",
            style="bold red" if view.exposed_level == "bad" else "",
        )
        text.append_text(sparkline(view.exposed, max(8, width - 30), lo=0, hi=1, style="magenta"))
        return text
