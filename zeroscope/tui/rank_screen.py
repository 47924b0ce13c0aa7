"""Rank detail: the rank's history plots beside the cluster's (step time, loss, memory by part,
exposed comm, offload), the last step's phases and collectives on one timeline (the step's own
axis), collectives by op (count, volume, time, bus bandwidth, exposed), and every other figure
the rank reports (rank_figures)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Footer, Static

from zeroscope.agent.schema import StepReport
from zeroscope.state import units
from zeroscope.state.viewmodel import RankState, rank_comm_view, role

from .base import StateScreen
from .charts import timeline
from .header import ClusterHeader
from .history_plot import Chart
from .history_plots import LIVE_INTERVAL_S, HistoryPlots
from .pane import Pane
from .plots import rank_charts
from .rank_figures import rank_figures

LANES = (
    ("all_gather", "cyan"),
    ("reduce_scatter", "green"),
    ("all_reduce", "yellow"),
    ("broadcast", "white"),
    ("reduce", "white"),
    ("p2p", "white"),
    ("all_to_all", "bright_magenta"),
    ("barrier", "grey50"),
    ("gather", "white"),
    ("scatter", "white"),
)
PHASES = (
    ("data", "D", "grey50"),
    ("forward", "F", "blue"),
    ("backward", "B", "magenta"),
    ("optimizer", "O", "yellow"),
    ("eval", "E", "green"),
)


class RankScreen(StateScreen):
    DEFAULT_CSS = """
    RankScreen #title { height: auto; padding: 0 1; background: $boost; }
    RankScreen #history { height: 18; border: round $primary-darken-2; padding: 0 1; }
    RankScreen #history:focus-within { border: round $accent; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.go_back", "back"),
        Binding("n", "next_plots", "more plots", show=False),
    ]

    def __init__(self, rank: int) -> None:
        super().__init__(name=f"rank{rank}")
        self.rank = rank

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        yield Static(id="title")
        with VerticalScroll():
            with Vertical(id="history") as history:
                history.border_title = f"rank {self.rank} beside the cluster over steps"
                yield HistoryPlots(
                    self._charts,
                    self._plot_key,
                    min_interval_s=LIVE_INTERVAL_S if self.zapp.live_clock else 0.0,
                )
            yield Pane("last step: phases and collectives", self._timeline, id="timeline")
            yield Pane("collectives by op (last step)", self._ops, id="ops")
            yield Pane("every figure (last step, newest sample)", self._figures, id="figures")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#timeline", Pane).focus(scroll_visible=False)
        self.refresh_view()

    def _charts(self) -> dict[str, Chart]:
        series = self.zapp.run_series or self.state.series
        return rank_charts(self.state, self.rank, series, self.zapp.cursor)

    def _plot_key(self) -> object:
        rs = self.rs
        newest = rs.history[-1].step if rs is not None and rs.history else None
        series = self.zapp.run_series or self.state.series
        return (self.rank, newest, id(series), series.version, self.zapp.cursor)

    def action_next_plots(self) -> None:
        self.query_one(HistoryPlots).next_page()

    @property
    def rs(self) -> RankState | None:
        return self.state.ranks.get(self.rank)

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())
        self.query_one("#title", Static).update(self._title())
        for pane in self.query(Pane):
            pane.refresh(layout=True)
        self.query_one(HistoryPlots).poke()

    def _title(self) -> Text:
        rs = self.rs
        text = Text()
        text.append(f"rank {self.rank}", style="bold")
        if rs is None:
            return text.append("  (no data yet)")
        if rs.hello:
            text.append(f" · {rs.hello.hostname or 'NA'} pid {rs.hello.pid} · {rs.hello.device}")
            where = role(rs.hello)
            if where:
                text.append(f" · {where}", style="bold")
        s = rs.summary
        if s is not None:
            slow = self.state.slowness(self.rank)
            text.append(f" · step {s.step} took {units.seconds(s.duration_s)}")
            text.append(f" (compute {'NA' if slow is None else f'{slow:.2f}x'} the others')")
            text.append(
                f" · loss {units.number(s.loss, '.4f')} · scale {units.scale(s.loss_scale)}"
            )
        if rs.bye:
            text.append(
                f" · exited {rs.bye.exit_code}", style="bold red" if rs.bye.exit_code else ""
            )
        return text

    # -- panes -------------------------------------------------------------------------------
    def _timeline(self, width: int) -> Text:
        rs = self.rs
        report = rs.latest if rs else None
        if report is None:
            return Text("NA")
        lane = max(10, width - 16)
        total = report.duration_s
        text = Text(f"{'phases':<15} ")
        text.append_text(_phase_row(report, total, lane))
        for op, style in LANES:
            spans = [
                (c.start_s, c.duration_s, c.exposed_s) for c in report.collectives if c.op == op
            ]
            if spans:
                text.append(f"\n{op:<15} ", style=style)
                text.append_text(timeline(spans, total, lane, style))
        for direction in ("d2h", "h2d", "nvme_read", "nvme_write"):
            spans = [
                (x.start_s, x.duration_s, 0.0) for x in report.transfers if x.direction == direction
            ]
            if spans:
                text.append(f"\n{direction:<15} ", style="white")
                text.append_text(timeline(spans, total, lane, "white"))
        text.append(f"\n{'':<15} 0{'':{max(0, lane - 8)}}{units.seconds(total):>7}", style="dim")
        text.append("\n█ exposed (the loop waited)  ▬ hidden behind compute", style="dim")
        return text

    def _ops(self, width: int) -> Text:
        text = Text(
            f"{'op':<15}{'count':>6}{'volume':>9}{'time':>8}{'busbw':>11}{'exposed':>9}",
            style="bold",
        )
        view = rank_comm_view(self.state, self.rank)
        if view is None or not view.ops:
            return text.append("\nno collectives reported", style="dim")
        for op, t in view.ops:
            text.append(
                f"\n{op:<15}{t.count:>6}{units.size(t.volume):>9}{units.seconds(t.time_s):>8}"
                f"{units.rate(t.busbw):>11}{units.seconds(t.exposed):>9}"
            )
        text.append(
            f"\nexposed {units.seconds(view.exposed_s)} = {units.percent(view.exposed_share)} "
            "of the step",
            style="bold red" if view.exposed_level == "bad" else "dim",
        )
        return text

    def _figures(self, width: int) -> Text:
        return rank_figures(self.rs, width)


def _phase_row(report: StepReport, total: float, lane: int) -> Text:
    """The phases on the step's own axis (the collectives' axis): each span where it ran;
    from reporters that give only sums, laid back to back."""
    cells = [" "] * lane
    styles = [""] * lane
    spans = [(p.name, p.start_s, p.duration_s) for p in report.phase_spans]
    if not spans:
        t = 0.0
        for name, _letter, _style in PHASES:
            value = getattr(report.phases, name)
            if value is not None:
                spans.append((name, t, value))
                t += value
    looks = {name: (letter, style) for name, letter, style in PHASES}
    for name, start, duration in spans:
        if total <= 0 or name not in looks:
            continue
        letter, style = looks[name]
        a = max(0, min(lane - 1, int(start / total * lane)))
        b = max(a + 1, min(lane, round((start + duration) / total * lane)))
        for i in range(a, b):
            cells[i], styles[i] = letter, f"bold {style} reverse"
    text = Text()
    for ch, st in zip(cells, styles):
        text.append(ch, style=st)
    return text
