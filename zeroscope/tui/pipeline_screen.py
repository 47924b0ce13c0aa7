"""Pipeline: the stages of one data-parallel replica over the last step's time.

For each stage: the measured timeline (each micro-batch's forward, backward, and under
zero-bubble schedules its input- and weight-gradient halves: each starts with its kind's letter
(F, B, I, W) and goes on with its micro-batch number, in the kind's colour, so forward and
backward read apart without colour too; ``·`` = idle), the schedule's planned timeline on the same width (unit costs),
and the figures: compute, P2P wait, measured bubble against the plan and against the prediction
from the measured stage durations. The slowest stage is marked. All figures come from
zeroscope/state/pipeline.py; this screen only draws them.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer

from zeroscope.state import units
from zeroscope.state.viewmodel import Act, PipelineView, judged_pipeline, layout_of

from .base import StateScreen
from .header import ClusterHeader
from .pane import Pane

KIND_STYLE = {"F": "bold green", "B": "bold blue", "I": "bold cyan", "W": "bold magenta"}
LABEL = 16
"""Columns before a timeline: ``stage 0 r12 meas``."""


def timeline(acts: list[Act], span: float, width: int) -> Text:
    """``width`` cells over [0, span): each action's first cell is its kind's letter, the
    rest its micro-batch number (a terminal without colour still tells F0 from B0)."""
    cells: list[tuple[str, str]] = [("·", "dim")] * width
    if span <= 0 or width <= 0:
        return Text("".join(c for c, _ in cells), style="dim")
    for a in acts:
        lo = int(a.start / span * width)
        hi = max(lo + 1, round(a.end / span * width))
        for i in range(max(0, lo), min(width, hi)):
            glyph = a.kind if i == max(0, lo) else str(a.microbatch % 10)
            cells[i] = (glyph, KIND_STYLE.get(a.kind, ""))
    text = Text()
    for ch, style in cells:
        text.append(ch, style=style)
    return text


def replicas(state_ranks: object) -> list[tuple[int, int]]:
    """(dp, tp) of every replica that runs a pipeline, sorted."""
    found = set()
    for rs in getattr(state_ranks, "values", lambda: [])():
        layout = layout_of(rs.hello)
        if layout is not None and layout.schedule:
            found.add((layout.dp, layout.tp))
    return sorted(found)


class PipelineScreen(StateScreen):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("n", "next_replica", "next replica")]

    def __init__(self) -> None:
        super().__init__(name="pipeline")
        self.replica = 0

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        with VerticalScroll():
            yield Pane("pipeline stages over the last step", self._stages, id="stages")
            yield Pane("bubble per stage: measured vs planned", self._bubbles, id="bubbles")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#stages", Pane).focus()
        self.refresh_view()

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())
        for pane in self.query(Pane):
            pane.refresh(layout=True)

    def action_next_replica(self) -> None:
        self.replica += 1
        self.refresh_view()

    def _view(self) -> PipelineView | None:
        found = replicas(self.state.ranks)
        if not found:
            return None
        dp, tp = found[self.replica % len(found)]
        return judged_pipeline(self.state, dp=dp, tp=tp)

    def _stages(self, width: int) -> Text:
        view = self._view()
        if view is None:
            return Text("no pipeline reported (a PipelineModule job shows its stages here)", "dim")
        text = Text()
        text.append(f"{view.schedule.removeprefix('Schedule')}", style="bold")
        text.append(
            f"  {len(view.rows)} ranks, {view.num_stages} stages, {view.microbatches} micro-batches"
            f"  replica dp {view.dp} tp {view.tp}  plan: {view.plan_source}"
        )
        text.append(f"  1F1B bound {units.percent(view.bound)}\n")
        cells = max(10, width - LABEL - 1)
        span = max((r.span_s for r in view.rows), default=0.0)
        slowest = view.slowest.pp
        for row in view.rows:
            mark = "▲" if row.pp == slowest and len(view.rows) > 1 else " "
            text.append(f"{mark}stage {row.pp:<2} r{row.rank:<4} ", style="bold")
            text.append("meas ")
            text.append_text(timeline(row.actions, span, cells - 5))
            text.append(f"\n{'':<{LABEL}}plan ", style="dim")
            text.append_text(timeline(row.planned, view.planned_makespan, cells - 5))
            text.append("\n")
        text.append("F", style=KIND_STYLE["F"])
        text.append(" forward  ")
        text.append("B", style=KIND_STYLE["B"])
        text.append(" backward  ")
        text.append("I", style=KIND_STYLE["I"])
        text.append("/")
        text.append("W", style=KIND_STYLE["W"])
        text.append(" input/weight grad (letter, then micro-batch)  · idle   ▲ slowest stage")
        return text

    def _bubbles(self, width: int) -> Text:
        view = self._view()
        if view is None:
            return Text("NA", style="dim")
        head = f"{'stage':<8}{'compute':>9}{'p2p wait':>10}{'tp comm':>9}"
        head += f"{'bubble':>8}{'plan':>7}{'predicted':>11}  "
        text = Text(head, style="bold")
        bar = max(6, width - len(head) - 1)
        for row in view.rows:
            text.append(f"\n{row.pp:<8}{units.seconds(row.compute_s):>9}")
            text.append(f"{units.seconds(row.p2p_wait_s):>10}{units.seconds(row.tp_comm_s):>9}")
            text.append(f"{units.percent(row.bubble_fraction):>8}")
            text.append(f"{units.percent(row.planned_bubble):>7}")
            text.append(f"{units.percent(row.predicted_bubble):>11}  ")
            filled = round((row.bubble_fraction or 0.0) * bar)
            text.append("█" * filled, style="bold red" if row.bubble_level == "bad" else "yellow")
            text.append("·" * (bar - filled), style="dim")
        slow, imbalance = view.slowest, view.imbalance
        text.append(
            f"\nslowest stage {slow.pp} (rank {slow.rank}): compute "
            f"{'NA' if imbalance is None else f'{imbalance:.2f}x'} the mean"
        )
        return text
