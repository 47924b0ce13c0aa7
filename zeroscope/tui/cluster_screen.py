"""The Cluster screen: header, the rank table (or heatmap when ranks do not fit, or one row per
node when the heatmap would not either), the cluster's history plots in the space the ranks
leave, alerts. Enter on a node shows that node's ranks; Escape goes back to the nodes."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Footer, Input, Static

from zeroscope.state.viewmodel import NodeView, StepSeries, node_ranks, rank_rows

from .alerts_strip import AlertsStrip
from .base import StateScreen
from .header import ClusterHeader
from .heatmap import RankHeatmap
from .history_plot import Chart
from .history_plots import LIVE_INTERVAL_S, MIN_HEIGHT, HistoryPlots
from .node_table import NodeTable
from .plots import cluster_charts
from .rank_rows import flags_from_alerts
from .rank_table import RankTable


class ClusterScreen(StateScreen):
    DEFAULT_CSS = """
    ClusterScreen #filter { dock: bottom; height: 3; display: none; }
    ClusterScreen #filter.open { display: block; }
    ClusterScreen RankTable, ClusterScreen RankHeatmap, ClusterScreen NodeTable { height: auto; }
    ClusterScreen RankHeatmap, ClusterScreen NodeTable { display: none; }
    ClusterScreen.heatmap RankHeatmap { display: block; }
    ClusterScreen.heatmap RankTable, ClusterScreen.nodes RankTable { display: none; }
    ClusterScreen.nodes NodeTable { display: block; }
    ClusterScreen #node-title { height: 1; display: none; text-style: bold; }
    ClusterScreen.drilled #node-title { display: block; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter"),
        Binding("v", "toggle_view", "view"),
        Binding("b", "toggle_nodes", "by node", show=False),
        Binding("escape", "back", "back", show=False),
        Binding("n", "next_plots", "more plots", show=False),
    ]

    def __init__(self) -> None:
        super().__init__(name="cluster")
        self._grouped = False
        self._view: str | None = None
        """"table" or "heatmap" once the user chose; None = automatic (heatmap if rows don't fit)."""
        self._by_node: bool | None = None
        """Rows per node: the user's ``b`` choice; None = automatic (when the heatmap does not
        fit either and the ranks run on more than one node)."""
        self._slot_mode = "table"
        """What the ranks' slot shows now: "table", "heatmap" or "nodes"."""
        self._drilled: tuple[int, str] | None = None
        """The node drilled into (its ranks in the table); None = the whole job."""
        self._shown_alerts: list = []

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        yield Static(id="node-title")
        yield RankTable(id="ranks")
        yield RankHeatmap(id="heatmap")
        yield NodeTable(id="nodes")
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

    def _pick_mode(self, table_rows: int, heat_rows: int, room: int) -> str:
        """The table while it fits (always for one node's ranks), else the heatmap while it
        fits, else one row per node when there are several; the user's choices win."""
        if self._drilled is not None:
            return "table"
        fits = table_rows + MIN_HEIGHT <= room or table_rows <= room // 2
        automatic = self._by_node is None and self._view is None and heat_rows > room and not fits
        if self.state.nodes.several and (self._by_node or automatic):
            return "nodes"
        heat = self._view == "heatmap" or (self._view is None and not fits)
        return "heatmap" if heat else "table"

    def _choose_view(self) -> None:
        """The ranks get the rows they need (the table, the heatmap when the table does not
        fit beside a row of plots, the nodes when the heatmap does not fit either); the plots
        get the rest. The user's ``v`` and ``b`` choices win."""
        table = self.query_one(RankTable)
        heatmap = self.query_one(RankHeatmap)
        nodes = self.query_one(NodeTable)
        plots = self.query_one(HistoryPlots)
        slots = (table, heatmap, nodes, plots)
        others = sum(w.outer_size.height for w in self.children if w not in slots)
        room = self.size.height - others
        if room <= 0:
            return  # mid-layout: decide once the screen has its size
        width = max(1, self.size.width)
        narrowed = table.filter_text or self._drilled is not None
        shown = len(table.shown_ranks) if narrowed else len(self.state.ranks)
        table_rows = max(2, shown + 1)
        heat_rows = 2 + -(-2 * max(1, shown) // width)  # title, cells at 2 a rank, legend
        mode = self._pick_mode(table_rows, heat_rows, room)
        rows = {"table": table_rows, "heatmap": heat_rows}.get(mode, self.state.nodes.count + 1)
        if rows + MIN_HEIGHT > room:
            # Not enough for both: the ranks keep what they need, up to all of it.
            rows = room if rows >= room - MIN_HEIGHT // 2 else room - MIN_HEIGHT
        if mode != self._slot_mode:
            was_focused = self.focused in (table, heatmap, nodes)
            self._slot_mode = mode
            self.set_class(mode == "heatmap", "heatmap")
            self.set_class(mode == "nodes", "nodes")
            self._fill()
            if was_focused:
                {"table": table, "heatmap": heatmap, "nodes": nodes}[mode].focus()
        for widget in (table, heatmap, nodes):
            if widget.styles.height is None or widget.styles.height.value != rows:
                widget.styles.height = max(2, min(rows, room))

    def _slot(self) -> RankTable | RankHeatmap | NodeTable:
        """The widget the ranks' slot shows now."""
        if self._slot_mode == "nodes":
            return self.query_one(NodeTable)
        return (
            self.query_one(RankHeatmap)
            if self._slot_mode == "heatmap"
            else self.query_one(RankTable)
        )

    def refresh_view(self) -> None:
        state = self.state
        self._shown_alerts = alerts = self.zapp.alerts()
        rows = self._fill()
        table = self.query_one(RankTable)
        shown = (len(table.shown_ranks), rows) if table.filter_text.strip() else None
        self.query_one(ClusterHeader).show(state, self.zapp.status_text(), shown=shown)
        self.query_one(AlertsStrip).show(alerts)
        self.query_one(HistoryPlots).poke()
        self._choose_view()

    def _fill(self) -> int:
        """Hand the shown slot its rows (only the nodes when nodes are shown: a 16,384-rank
        job's frame then folds the nodes the table draws, not a row per rank); returns how
        many ranks the table holds."""
        state = self.state
        flagged = flags_from_alerts(state, self._shown_alerts)
        if self._slot_mode == "nodes":
            self.query_one(NodeTable).set_nodes(NodeView(state, flagged))
            return len(state.ranks)
        ranks = None if self._drilled is None else node_ranks(state, self._drilled)
        rows = rank_rows(state, flagged, ranks)
        table = self.query_one(RankTable)
        if not self._grouped and any(row.mesh is not None for row in rows):
            self._grouped = True  # a 3D-parallel job: rows grouped by stage, replica, shard
            if table.sort_key == "rank":
                table.sort_key = "mesh"
        table.set_rows(rows)
        self.query_one(RankHeatmap).set_rows(rows, state.rules)
        return len(rows)

    def action_next_plots(self) -> None:
        self.query_one(HistoryPlots).next_page()

    def action_toggle_view(self) -> None:
        self._view = "table" if self.has_class("heatmap") else "heatmap"
        if self._slot_mode == "nodes":
            self._by_node = False
        self._choose_view()

    def action_toggle_nodes(self) -> None:
        """One row per node, or back to the ranks (a job on one node has no node rows)."""
        self._by_node = self._slot_mode != "nodes"
        self._drilled = None
        self.remove_class("drilled")
        self._choose_view()

    def on_node_table_selected(self, message: NodeTable.Selected) -> None:
        """Drill into a node: the table shows its ranks until Escape."""
        self._drilled = message.key
        ranks = node_ranks(self.state, message.key)
        self.query_one("#node-title", Static).update(
            f"node {message.name}: {len(ranks)} ranks (escape: all nodes)"
        )
        self.add_class("drilled")
        self.query_one(RankTable).focus()
        self.refresh_view()
        self.call_after_refresh(self._choose_view)  # once the title's line is laid out

    def action_back(self) -> None:
        """Escape: out of a node's ranks back to the nodes, else clear the filter."""
        if self._drilled is not None and not self.query_one("#filter", Input).has_class("open"):
            self._drilled = None
            self.remove_class("drilled")
            self._choose_view()
            self.query_one(NodeTable).focus()
            self.refresh_view()
            return
        self.action_clear_filter()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("open")
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._apply_filter(event.value)
        event.input.remove_class("open")
        self._slot().focus()

    def _apply_filter(self, text: str) -> None:
        self.query_one(RankTable).filter_text = text
        self.query_one(RankHeatmap).filter_text = text
        self.refresh_view()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("open")
        self._apply_filter("")
        self._slot().focus()

    def on_rank_table_selected(self, message: RankTable.Selected) -> None:
        self.zapp.open_rank(message.rank)
