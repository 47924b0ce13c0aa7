"""The Cluster screen: header, the rank table (or heatmap when ranks do not fit), alerts."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Input

from .alerts_strip import AlertsStrip
from .base import StateScreen
from .header import ClusterHeader
from .heatmap import RankHeatmap
from .rank_rows import flags_from_alerts, rank_rows
from .rank_table import RankTable


class ClusterScreen(StateScreen):
    DEFAULT_CSS = """
    ClusterScreen #filter { dock: bottom; height: 3; display: none; }
    ClusterScreen #filter.open { display: block; }
    ClusterScreen RankHeatmap { display: none; }
    ClusterScreen.heatmap RankHeatmap { display: block; }
    ClusterScreen.heatmap RankTable { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter"),
        Binding("v", "toggle_view", "table/heatmap"),
        Binding("escape", "clear_filter", "clear", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(name="cluster")
        self._grouped = False
        self._view: str | None = None
        """"table" or "heatmap" once the user chose; None = automatic (heatmap if rows don't fit)."""

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        yield RankTable(id="ranks")
        yield RankHeatmap(id="heatmap")
        yield AlertsStrip()
        yield Input(
            placeholder="filter: 3  0-7  r12  node1  slow   (enter: apply, escape: clear)",
            id="filter",
        )
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(RankTable).focus()
        self.refresh_view()

    def on_rank_table_resized(self) -> None:
        self._choose_view()

    def _choose_view(self) -> None:
        table = self.query_one(RankTable)
        heatmap = self.query_one(RankHeatmap)
        # The table and the heatmap share one 1fr slot; whichever is shown knows its height.
        height = (heatmap if self.has_class("heatmap") else table).size.height
        if height == 0 and self._view is None:
            return  # mid-layout: decide once the slot has its size
        fits = len(self.state.ranks) <= height - 1
        heat = self._view == "heatmap" or (self._view is None and not fits)
        if heat != self.has_class("heatmap"):
            self.set_class(heat, "heatmap")
            if self.focused in (table, heatmap):
                (heatmap if heat else table).focus()

    def refresh_view(self) -> None:
        state = self.state
        alerts = self.zapp.alerts()
        rows = rank_rows(state, flags_from_alerts(state, alerts))
        self.query_one(ClusterHeader).show(state, self.zapp.status_text())
        table = self.query_one(RankTable)
        if not self._grouped and any(row.mesh is not None for row in rows):
            self._grouped = True  # a 3D-parallel job: rows grouped by stage, replica, shard
            if table.sort_key == "rank":
                table.sort_key = "mesh"
        table.set_rows(rows)
        self.query_one(RankHeatmap).set_rows(rows)
        self.query_one(AlertsStrip).show(alerts)
        self._choose_view()

    def action_toggle_view(self) -> None:
        self._view = "table" if self.has_class("heatmap") else "heatmap"
        self._choose_view()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._apply_filter(event.value)
        event.input.remove_class("open")
        (
            self.query_one(RankHeatmap) if self.has_class("heatmap") else self.query_one(RankTable)
        ).focus()

    def _apply_filter(self, text: str) -> None:
        self.query_one(RankTable).filter_text = text
        self.query_one(RankHeatmap).filter_text = text

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("open")
        self._apply_filter("")
        (
            self.query_one(RankHeatmap) if self.has_class("heatmap") else self.query_one(RankTable)
        ).focus()

    def on_rank_table_selected(self, message: RankTable.Selected) -> None:
        self.zapp.open_rank(message.rank)
