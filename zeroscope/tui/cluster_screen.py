"""The Cluster screen: header, the rank table (or heatmap when ranks do not fit), the cluster's
history plots in the space the ranks leave, alerts."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Input

from zeroscope.state.viewmodel import StepSeries, rank_rows

from .alerts_strip import AlertsStrip
from .base import StateScreen
from .header import ClusterHeader
from .heatmap import RankHeatmap
from .history_plot import Chart
from .history_plots import LIVE_INTERVAL_S, MIN_HEIGHT, HistoryPlots
from .plots import cluster_charts
from .rank_rows import flags_from_alerts
from .rank_table import RankTable


class ClusterScreen(StateScreen):
    DEFAULT_CSS = """
    ClusterScreen #filter { dock: bottom; height: 3; display: none; }
    ClusterScreen #filter.open { display: block; }
    ClusterScreen RankTable, ClusterScreen RankHeatmap { height: auto; }
    ClusterScreen RankHeatmap { display: none; }
    ClusterScreen.heatmap RankHeatmap { display: block; }
    ClusterScreen.heatmap RankTable { display: none; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter"),
        Binding("v", "toggle_view", "view"),
        Binding("escape", "clear_filter", "clear", show=False),
        Binding("n", "next_plots", "more plots", show=False),
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
        yield HistoryPlots(
            self._charts,
            self._plot_key,
            min_interval_s=LIVE_INTERVAL_S if self.zapp.live_clock else 0.0,
            id="plots",
        )
        yield AlertsStrip()
        yield Input(
            placeholder="filter: 3  0-7  r12  node1  slow   (enter: apply, escape: clear)",
            id="filter",
        )
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(RankTable).focus()
        self.refresh_view()

    def on_rank_table_resized(self) -> None:
        self._choose_view()

    def on_resize(self) -> None:
        self._choose_view()

    def _charts(self) -> dict[str, Chart]:
        return cluster_charts(self.plot_series, self.state.rules.exposed_max, self.zapp.cursor)

    def _plot_key(self) -> object:
        series = self.plot_series
        return (id(series), series.version, self.zapp.cursor)

    @property
    def plot_series(self) -> StepSeries:
        """The whole run's series in replay (once read), else the state's own."""
        return self.zapp.run_series or self.state.series

    def _choose_view(self) -> None:
        """The ranks get the rows they need (the table, or the heatmap when the table does not
        fit beside a row of plots); the plots get the rest. The user's ``v`` choice wins."""
        table = self.query_one(RankTable)
        heatmap = self.query_one(RankHeatmap)
        plots = self.query_one(HistoryPlots)
        others = sum(w.outer_size.height for w in self.children if w not in (table, heatmap, plots))
        room = self.size.height - others
        if room <= 0:
            return  # mid-layout: decide once the screen has its size
        width = max(1, self.size.width)
        shown = len(table.shown_ranks) if table.filter_text else len(self.state.ranks)
        table_rows = max(2, shown + 1)
        heat_rows = 2 + -(-2 * max(1, shown) // width)  # title, cells at 2 a rank, legend
        fits = table_rows + MIN_HEIGHT <= room or table_rows <= room // 2
        heat = self._view == "heatmap" or (self._view is None and not fits)
        rows = heat_rows if heat else table_rows
        if rows + MIN_HEIGHT > room:
            # Not enough for both: the ranks keep what they need, up to all of it.
            rows = room if rows >= room - MIN_HEIGHT // 2 else room - MIN_HEIGHT
        if heat != self.has_class("heatmap"):
            self.set_class(heat, "heatmap")
            if self.focused in (table, heatmap):
                (heatmap if heat else table).focus()
        for widget in (table, heatmap):
            if widget.styles.height is None or widget.styles.height.value != rows:
                widget.styles.height = max(2, min(rows, room))

    def refresh_view(self) -> None:
        state = self.state
        alerts = self.zapp.alerts()
        rows = rank_rows(state, flags_from_alerts(state, alerts))
        table = self.query_one(RankTable)
        if not self._grouped and any(row.mesh is not None for row in rows):
            self._grouped = True  # a 3D-parallel job: rows grouped by stage, replica, shard
            if table.sort_key == "rank":
                table.sort_key = "mesh"
        table.set_rows(rows)
        shown = (len(table.shown_ranks), len(rows)) if table.filter_text.strip() else None
        self.query_one(ClusterHeader).show(state, self.zapp.status_text(), shown=shown)
        self.query_one(RankHeatmap).set_rows(rows, state.rules)
        self.query_one(AlertsStrip).show(alerts)
        self.query_one(HistoryPlots).poke()
        self._choose_view()

    def action_next_plots(self) -> None:
        self.query_one(HistoryPlots).next_page()

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
        self.refresh_view()

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
