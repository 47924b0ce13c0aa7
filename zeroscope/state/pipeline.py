"""Pipeline-parallel figures derived from the ranks' reports (pure Python; the Pipeline screen,
the cluster grouping and ``summary --json`` only format these).

Per rank and step, measured: compute (the stage's forward / backward / weight-gradient time of
every micro-batch), P2P wait, and the bubble = step - compute, as a fraction of the step, where
the step is the replica's pipeline span (the longest schedule step among its stages: the ranks
start the schedule together and the first stage finishes last; a stage that finishes early
idles until the others do, in the next collective). Beside it, two timelines obtained by running the schedule's order of actions through its
dependencies (F of stage s needs F of s-1; B or I of s needs F of s and B/I of s+1; W needs I):

- *planned*: unit costs (F = I = W = 1, B = 2), the schedule's own plan (its ``pipeline_order``,
  or the order it really executed where torch's plan is incomplete). For 1F1B on balanced
  stages its bubble is the textbook (p - 1) / (m + p - 1) on every stage;
- *predicted*: the same order with each stage's measured mean durations: what the bubble must be
  given the stages' imbalance alone, with free and instant P2P. Measured minus predicted is
  what communication and overheads add.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zeroscope.agent.schema import Hello, ParallelLayout, PipelineStep, StepReport

if TYPE_CHECKING:
    from .alerts import Level

UNIT_COST = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
_ACTION = re.compile(r"^(\d+)([FBIW])(\d+)$")
Key = tuple[int, str, int]
"""(stage, kind, micro-batch)."""


def one_f_one_b_bound(stages: int, microbatches: int) -> float | None:
    """The 1F1B (and GPipe) bubble fraction (p - 1) / (m + p - 1) for balanced stages."""
    if stages < 1 or microbatches < 1:
        return None
    return (stages - 1) / (microbatches + stages - 1)


def bubble_fraction(span_s: float, compute_s: float) -> float | None:
    """A stage's bubble: the share of the pipeline span it spent not computing,
    max(0, span - compute) / span; NA for an empty span. The Pipeline screen's rows, its mean
    over the stages (:func:`mean_bubble`), the advisor's pipeline rule and the summary's pipeline
    fields (``state.mesh.PipelineRun``) all use this one."""
    return max(0.0, span_s - compute_s) / span_s if span_s > 0 else None


def mean_bubble(span_s: float, computes: Iterable[float]) -> float | None:
    """The pipeline's bubble: the mean of its stages' :func:`bubble_fraction` over one span."""
    fractions = [bubble_fraction(span_s, c) for c in computes]
    known = [f for f in fractions if f is not None]
    return sum(known) / len(known) if known else None


def imbalance(loads: Iterable[float]) -> float | None:
    """The slowest stage's compute over the mean stage's (1.0 = balanced); NA when the mean is
    0. The Pipeline screen's footer and the advisor's pipeline rule use this one."""
    values = list(loads)
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


@dataclass(frozen=True, slots=True)
class Act:
    kind: str
    stage: int
    microbatch: int
    start: float
    duration: float

    @property
    def end(self) -> float:
        return self.start + self.duration


def _deps(stage: int, kind: str, mb: int, num_stages: int) -> list[tuple[Key, ...]]:
    """Each entry: alternatives, one of which must be done before (stage, kind, mb) starts."""
    if kind == "F":
        return [((stage - 1, "F", mb),)] if stage > 0 else []
    if kind == "W":
        return [((stage, "I", mb),)]
    deps: list[tuple[Key, ...]] = [((stage, "F", mb),)]
    if stage < num_stages - 1:
        deps.append(((stage + 1, "B", mb), (stage + 1, "I", mb)))
    return deps


def simulate(
    orders: dict[int, list[Key]], num_stages: int, cost: Callable[[int, str], float]
) -> dict[int, list[Act]] | None:
    """Run each rank's actions in its order, each starting when the rank is free and its
    dependencies are done; None when the orders deadlock (an incomplete plan)."""
    done: dict[Key, float] = {}
    pos = dict.fromkeys(orders, 0)
    free = dict.fromkeys(orders, 0.0)
    out: dict[int, list[Act]] = {r: [] for r in orders}
    left = sum(len(o) for o in orders.values())
    while left:
        progressed = False
        for r, order in orders.items():
            while pos[r] < len(order):
                stage, kind, mb = order[pos[r]]
                ends = []
                for alternatives in _deps(stage, kind, mb, num_stages):
                    end = next((done[k] for k in alternatives if k in done), None)
                    if end is None:
                        break
                    ends.append(end)
                else:
                    start = max([free[r], *ends])
                    act = Act(kind, stage, mb, start, cost(stage, kind))
                    done[(stage, kind, mb)] = free[r] = act.end
                    out[r].append(act)
                    pos[r] += 1
                    left -= 1
                    progressed = True
                    continue
                break
        if not progressed:
            return None
    return out


def idle_fraction(acts: list[Act], makespan: float) -> float | None:
    if makespan <= 0:
        return None
    return max(0.0, 1.0 - sum(a.duration for a in acts) / makespan)


def parse_plan(plan: Iterable[str]) -> list[Key] | None:
    keys = []
    for item in plan:
        m = _ACTION.match(item)
        if m is None:
            return None
        keys.append((int(m.group(1)), m.group(2), int(m.group(3))))
    return keys or None


@dataclass(slots=True)
class StageRow:
    """One pipeline rank of a replica in one step: measured, planned and predicted."""

    rank: int
    pp: int
    stages: list[int]
    step: int
    step_s: float
    p2p_wait_s: float
    tp_comm_s: float
    actions: list[Act]
    planned: list[Act] = field(default_factory=list)
    predicted: list[Act] = field(default_factory=list)
    planned_bubble: float | None = None
    predicted_bubble: float | None = None
    span_s: float = 0.0
    """The replica's pipeline span this step (see the module docstring)."""
    bubble_level: Level = "na"
    """The bubble against the plan, set by the view-model (viewmodel.judged_pipeline)."""

    @property
    def compute_s(self) -> float:
        return sum(a.duration for a in self.actions)

    @property
    def bubble_s(self) -> float:
        return max(0.0, max(self.span_s, self.step_s) - self.compute_s)

    @property
    def bubble_fraction(self) -> float | None:
        return bubble_fraction(max(self.span_s, self.step_s), self.compute_s)


@dataclass(slots=True)
class PipelineView:
    """One data-parallel replica's pipeline (its pp ranks at one tensor shard) in one step."""

    schedule: str
    microbatches: int
    num_stages: int
    dp: int
    tp: int
    rows: list[StageRow]
    plan_source: str
    bound: float | None
    planned_makespan: float = 0.0
    predicted_makespan: float = 0.0

    @property
    def slowest(self) -> StageRow:
        """The rank whose stages compute longest: every other stage waits on it."""
        return max(self.rows, key=lambda r: (r.compute_s, -r.pp))

    @property
    def imbalance(self) -> float | None:
        """Slowest stage's compute over the mean (1.0 = balanced)."""
        return imbalance(r.compute_s for r in self.rows)


def layout_of(hello: Hello | None) -> ParallelLayout | None:
    return hello.parallel if hello is not None else None


def tp_comm_s(report: StepReport) -> float:
    """Time of the step's tensor-parallel collectives (label ``tp``)."""
    return sum(c.duration_s for c in report.collectives if c.label == "tp")


def _acts(step: PipelineStep) -> list[Act]:
    return [Act(a.kind, a.stage, a.microbatch, a.start_s, a.duration_s) for a in step.actions]


def pipeline_view(ranks: Iterable[Any], *, dp: int = 0, tp: int = 0) -> PipelineView | None:
    """The view of replica (dp, tp) from RankStates (``hello`` and ``latest``), or None when
    that replica has no pipeline reports yet."""
    members = []
    for rs in ranks:
        layout = layout_of(rs.hello)
        report = rs.latest
        if layout is None or not layout.schedule or report is None or report.pipeline is None:
            continue
        if layout.dp == dp and layout.tp == tp:
            members.append((layout, rs.rank, report))
    if not members:
        return None
    members.sort(key=lambda m: m[0].pp)
    first = members[0][0]
    rows = [
        StageRow(
            rank=rank,
            pp=layout.pp,
            stages=list(layout.stages),
            step=report.step,
            step_s=report.pipeline.step_s,
            p2p_wait_s=report.pipeline.p2p_wait_s,
            tp_comm_s=tp_comm_s(report),
            actions=_acts(report.pipeline),
        )
        for layout, rank, report in members
    ]
    span = max(row.step_s for row in rows)
    for row in rows:
        row.span_s = span
    view = PipelineView(
        schedule=first.schedule,
        microbatches=first.microbatches,
        num_stages=first.num_stages,
        dp=dp,
        tp=tp,
        rows=rows,
        plan_source="pipeline_order",
        bound=one_f_one_b_bound(first.pp_size, first.microbatches),
    )
    orders: dict[int, list[Key]] = {}
    for (layout, _, _), row in zip(members, rows):
        plan = parse_plan(layout.plan)
        if plan is None:
            view.plan_source = "executed order"
            plan = [
                (a.stage, a.kind, a.microbatch) for a in sorted(row.actions, key=lambda a: a.start)
            ]
        orders[row.pp] = plan
    if len(rows) == first.pp_size:
        _fill_timelines(view, orders)
    return view


def _fill_timelines(view: PipelineView, orders: dict[int, list[Key]]) -> None:
    planned = simulate(orders, view.num_stages, lambda _s, k: UNIT_COST[k])
    means: dict[tuple[int, str], list[float]] = {}
    for row in view.rows:
        for a in row.actions:
            means.setdefault((a.stage, a.kind), []).append(a.duration)
    mean = {k: sum(v) / len(v) for k, v in means.items()}
    predicted = simulate(orders, view.num_stages, lambda s, k: mean.get((s, k), 0.0))
    for timeline, attr in ((planned, "planned"), (predicted, "predicted")):
        if timeline is None:
            continue
        makespan = max((a.end for acts in timeline.values() for a in acts), default=0.0)
        setattr(view, f"{attr}_makespan", makespan)
        for row in view.rows:
            acts = timeline.get(row.pp, [])
            setattr(row, attr, acts)
            setattr(row, f"{attr}_bubble", idle_fraction(acts, makespan))
