"""One rank as the viewer knows it: identity, the latest full report, a compact per-step history
and the run's aggregates.

History keeps a :class:`StepSummary` per step (a few dozen numbers), not the whole StepReport:
1024 ranks x a long window of full reports with hundreds of collectives each would cost
gigabytes. The latest full report is kept for the drill-down timeline. Every per-rank figure a
view shows is a field or property of RankState or StepSummary, defined once, with its unit.

:func:`summarize` is the one definition of a report's summary. StepSummary and OpTotals are
defined with the wire (zeroscope/agent/schema_summary.py says why, and why they are untracked
by the garbage collector): a node's relay makes the summary with this very function and sends
it inside the report, and :meth:`RankState.record` takes it as made when it is of this code's
version, so a 16,384-rank view does not fold every rank's every collective.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

from zeroscope.agent.schema import (
    SUMMARY_VERSION,
    Bye,
    Hello,
    HostSample,
    OpTotals,
    StepReport,
    StepSummary,
)

from .bandwidth import volume, wire_factor
from .collective_fold import fold, sequence_of
from .totals import RankTotals

_NBYTES = attrgetter("nbytes")
_DURATION = attrgetter("duration_s")

HISTORY_STEPS = 512
"""Steps of per-rank history kept for the over-time charts (fewer for a large job, below)."""

RANK_STEPS_KEPT = 1 << 20
"""Rank-steps of summaries a view keeps in all: each rank's history and each kept step's
reports hold the same ~1.5 KB summaries (18 collectives a report), so 512 steps of 16,384 ranks
grew a viewer by ~25 MB a step, ~13 GB at 512 (bench/view_ingest.py --long). A job of more than
2,048 ranks keeps fewer steps of them, never fewer than :data:`MIN_STEPS_KEPT`; the cluster's
series (StepSeries: one point a step) keeps its HISTORY_STEPS whatever the job's size."""

MIN_STEPS_KEPT = 64
"""The fewest steps of summaries kept: every window the alerts and the advice read (the
advice's 32 steps, the straggler and overflow-storm windows) fits in it."""


def steps_kept(world_size: int, history_steps: int = HISTORY_STEPS) -> int:
    """Steps of summaries (per-rank history, per-step reports) a view of ``world_size`` ranks
    keeps: ``history_steps``, fewer where that many would exceed :data:`RANK_STEPS_KEPT`."""
    budget = RANK_STEPS_KEPT // max(1, world_size)
    return min(history_steps, max(MIN_STEPS_KEPT, budget))


def fingerprint(report: StepReport) -> int:
    """Hash of the step's collective sequence, the part every rank must agree on (op, size,
    label in issue order; timing left out); 0 when some were unfinished or none issued."""
    return sequence_of(report.collectives, report.collectives_unfinished)


def _group_factors(op: str, size: int) -> tuple[int, float]:
    """(volume per byte, wire bytes per timed byte) of one (op, group size): the collectives'
    volume and bus bytes are linear in S (bandwidth.volume, bandwidth.wire_bytes), so a group's
    figures are its summed bytes times these, the very products those functions make."""
    return volume(op, 1), wire_factor(op, size)


_FACTORS: dict[tuple[str, int], tuple[int, float]] = {}
""":func:`_group_factors` by (op, group size), worked out once a process: a report's groups
called volume, wire_bytes and bus_factor each (~1 us of a ~12 us summary). Bounded: a job has a
few ops and group sizes."""


def summarize(report: StepReport) -> StepSummary:
    """Fold one StepReport into the figures the views need."""
    # Per (op, group size) from zeroscope.state.collective_fold; volume and bus bytes are
    # linear in S, so they are applied once per group rather than per collective.
    folded = fold(report.collectives, report.collectives_unfinished)
    ops: dict[str, OpTotals] = {}
    total_volume = 0
    comm_s = exposed = bus_total = 0.0
    untimed_all = unexposed_all = 0
    for key, (
        count,
        nbytes,
        seconds,
        waited,
        untimed,
        unexposed,
        timed_bytes,
    ) in folded.groups.items():
        factors = _FACTORS.get(key)
        if factors is None:
            factors = _FACTORS[key] = _group_factors(*key)
        v = nbytes * factors[0]
        bus = timed_bytes * factors[1]
        op = key[0]
        totals = ops.get(op)
        if totals is None:  # the op's first group size (most ops have one)
            ops[op] = OpTotals(count, nbytes, v, seconds, waited, bus, untimed, unexposed)
        else:
            totals.count += count
            totals.nbytes += nbytes
            totals.volume += v
            totals.seconds += seconds
            totals.exposed_s += waited
            totals.bus_bytes += bus
            totals.untimed += untimed
            totals.unexposed += unexposed
        total_volume += v
        comm_s += seconds
        exposed += waited
        bus_total += bus
        untimed_all += untimed
        unexposed_all += unexposed
    m = report.memory
    return StepSummary(
        version=SUMMARY_VERSION,
        step=report.step,
        wall_ns=report.wall_ns,
        duration_s=report.duration_s,
        params=m.params,
        frozen_params=m.frozen_params,
        grads=m.grads,
        optim=m.optim,
        activations=m.activations,
        host_bytes=m.host_params + m.host_grads + m.host_optim,
        gathered_params=m.gathered_params,
        nvme_bytes=m.nvme_bytes,
        device_peak=m.device_peak,
        comm_volume=total_volume,
        comm_s=comm_s,
        busy_s=folded.busy_s,
        exposed_s=exposed,
        bus_bytes=bus_total,
        offload_bytes=sum(map(_NBYTES, report.transfers)),
        offload_s=sum(map(_DURATION, report.transfers)),
        loss=report.loss,
        loss_scale=report.loss_scale,
        grad_norm=report.grad_norm,
        lr=report.lr,
        overflow=report.overflow,
        samples=report.samples,
        prefetched=folded.prefetched,
        collectives=len(report.collectives),
        untimed=untimed_all,
        unexposed=unexposed_all,
        ops=ops,
        sequence=folded.sequence,
        work=report.work,
        forward_backward_s=_forward_backward(report),
        eval_s=report.phases.eval,
    )


def _forward_backward(report: StepReport) -> float | None:
    phases = report.phases
    if phases.forward is None and phases.backward is None:
        return None
    return (phases.forward or 0.0) + (phases.backward or 0.0)


@dataclass(slots=True)
class RankState:
    """Everything known about one rank. The per-rank API later views build on:
    ``summary`` (its newest step), ``history`` (the last HISTORY_STEPS steps, oldest first),
    ``totals`` (the whole run), ``lag`` (straggler standing) and ``host`` (the newest sample)."""

    rank: int
    hello: Hello | None = None
    latest: StepReport | None = None
    summary: StepSummary | None = None
    history: deque[StepSummary] = field(default_factory=lambda: deque(maxlen=HISTORY_STEPS))
    totals: RankTotals = field(default_factory=RankTotals)
    last_seen_s: float | None = None
    dropped: int = 0
    bye: Bye | None = None
    host: HostSample | None = None
    """The newest host/GPU sampler figures, from a heartbeat or a step report."""
    slowness: float | None = None
    """Compute time in its newest complete step relative to the median of the other ranks'
    (1.00 = typical) [ratio]; set when a step closes (zeroscope.state.stragglers)."""

    @property
    def hostname(self) -> str:
        return self.hello.hostname if self.hello else ""

    def record(self, report: StepReport) -> StepSummary:
        """Take a step report (replacing the latest; out-of-order old steps only add history).
        Its summary is the one a relay made and sent inside it when that is of this code's
        version and step, else made here."""
        summary = report.summary
        if summary is None or summary.version != SUMMARY_VERSION or summary.step != report.step:
            summary = summarize(report)
        if self.latest is None or report.step >= self.latest.step:
            self.latest, self.summary = report, summary
            if report.host is not None:
                self.host = report.host
        self.history.append(summary)
        self.totals.add(summary)
        self.dropped += report.dropped
        return summary
