"""One rank as the viewer knows it: identity, the latest full report, a compact per-step history
and the run's aggregates.

History keeps a :class:`StepSummary` per step (a few dozen numbers), not the whole StepReport:
1024 ranks x a long window of full reports with hundreds of collectives each would cost
gigabytes. The latest full report is kept for the drill-down timeline. Every per-rank figure a
view shows is a field or property here, defined once, with its unit.

:class:`StepSummary` and :class:`OpTotals` are msgspec Structs with ``gc=False``, not slotted
dataclasses: one of each is made for every report of every rank, and the history keeps 512 steps
of them a rank (8 M summaries at 16,384 ranks). Untracked by the cyclic garbage collector, they
are never walked by it (nor is the ``ops`` dict of untracked OpTotals, which CPython leaves
untracked); built by msgspec's C ``__init__``, a 35-field summary takes ~0.7 us instead of ~1.0.
Safe because neither can be part of a reference cycle: a summary holds numbers, its ``ops``
dict of OpTotals (numbers) and the report's ``Work`` (numbers and strings), nothing that points
back. Measured at 16,384 ranks (bench/view_ingest.py, Python's default collector thresholds):
the collections in four steps' ingest fell from ~560 to ~115 ms, a step's fold from ~550 to
~380 ms of CPU (docs/bench.md, "The view's ingest and replay seek at 16,384 ranks").
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec

from zeroscope.agent.schema import Bye, Hello, HostSample, StepReport, Work

from .bandwidth import busbw_of, volume, wire_factor
from .collective_fold import fold, sequence_of
from .totals import RankTotals

_NBYTES = attrgetter("nbytes")
_DURATION = attrgetter("duration_s")

HISTORY_STEPS = 512
"""Steps of per-rank history kept for the over-time charts."""


class OpTotals(msgspec.Struct, gc=False):
    """One collective op's totals within a step (the rank-detail table's row). Untracked by the
    garbage collector (``gc=False``: numbers only; the module's docstring says why)."""

    count: int = 0
    nbytes: int = 0
    """Sum of message sizes S (nccl-tests convention) [bytes]."""
    volume: int = 0
    """Sum of :func:`bandwidth.volume` (all-reduce counts 2S) [bytes]."""
    seconds: float = 0.0
    """Sum of issue-to-completion times [s]."""
    exposed_s: float = 0.0
    """Sum of the time the loop waited for them [s]."""
    bus_bytes: float = 0.0
    """Sum of S x the nccl-tests bus factor of each collective's own group size [bytes], over
    the collectives with a time (clock not ``none``, and more than 0 s: a synchronous op handed
    to the agent after it ran has 0 s; bytes with no time would inflate the bandwidth)."""
    untimed: int = 0
    """Collectives no clock measured (``Collective.clock`` none): in count, bytes and volume,
    never in seconds, busbw or exposed."""
    unexposed: int = 0
    """Collectives whose exposed time was not measured."""

    @property
    def busbw(self) -> float | None:
        """Time-weighted bus bandwidth: sum(S·factor) / sum(t) [bytes/s]; NA when any of the
        op's collectives was untimed (a part would pass for the whole: a 4-byte host-timed
        all-reduce beside DDP's untimed buckets on gloo read 0.000 GB/s)."""
        return None if self.untimed else busbw_of(self.bus_bytes, self.seconds)

    @property
    def time_s(self) -> float | None:
        """Summed issue-to-completion time [s]; NA when any collective of the op was untimed
        (a partial sum would pass for the whole)."""
        return None if self.untimed else self.seconds

    @property
    def exposed(self) -> float | None:
        """Summed exposed time [s]; NA when any collective of the op had it unmeasured (a
        partial sum would pass for the whole)."""
        return None if self.unexposed else self.exposed_s


class StepSummary(msgspec.Struct, gc=False):
    """One rank's step, as every view needs it. None = not reported (NA), never 0. Untracked by
    the garbage collector (``gc=False``: no cycle can run through it; the module's docstring
    says why); copy one with ``msgspec.structs.replace``."""

    step: int
    wall_ns: int
    duration_s: float
    """The rank's step time [s]."""
    params: int | None
    grads: int | None
    optim: int | None
    activations: int | None
    host_bytes: int
    """Offloaded P + G + O in host memory [bytes]."""
    gathered_params: int
    nvme_bytes: int
    device_peak: int | None
    comm_volume: int
    """Sum of every collective's volume (all-reduce counts twice; bandwidth.volume) [bytes]."""
    comm_s: float
    """Sum of collective issue-to-completion times [s]."""
    busy_s: float
    """Time with a collective in flight (zeroscope.state.collective_fold.busy_seconds) [s]."""
    exposed_s: float
    """Time the loop waited inside collectives: sum of ``Collective.exposed_s`` [s]."""
    bus_bytes: float
    offload_bytes: int
    offload_s: float
    loss: float | None
    loss_scale: float | None
    grad_norm: float | None
    lr: float | None
    overflow: bool
    samples: int
    prefetched: int
    """Collectives issued ahead of need (stage-3 prefetch)."""
    collectives: int
    """Collectives reported in the step."""
    ops: dict[str, OpTotals]
    untimed: int = 0
    """Collectives no clock measured: counted in ``collectives`` and ``comm_volume`` only."""
    unexposed: int = 0
    """Collectives whose exposed time was not measured: ``exposed_share`` is then NA."""
    sequence: int = 0
    """Fingerprint of the step's collective sequence (op, bytes, label, in issue order), to
    compare ranks within this process (zeroscope.state.sequences); 0 = not comparable (some
    collectives unfinished) or none issued."""
    frozen_params: int | None = None
    """Of ``params``: bytes of frozen parameters (no G or O of their own); None = not said."""
    work: Work | None = None
    """Tokens, model FLOPs and the device's peak as the rank sent them (None = not reported);
    the figures made of them are zeroscope.state.throughput's."""
    forward_backward_s: float | None = None
    """The step's forward plus backward phase time [s] (None = neither reported): the compute
    a stage-3 prefetch can hide its fetches behind, priced per step by the advisor."""

    @property
    def compute_s(self) -> float | None:
        """Compute time: the step minus the time waiting in collectives [s]. Under synchronous
        collectives every rank's step time is the same; this is what differs. NA when some
        collective's wait was not measured (DDP's buckets on gloo): the step less a partial
        wait is the step time again, which names no straggler and would pass for compute."""
        if self.unexposed:
            return None
        return max(self.duration_s - self.exposed_s, 0.0)

    @property
    def exposed(self) -> float | None:
        """The loop's wait in collectives [s]; NA when some collective's wait was not measured
        (a partial sum would pass for the whole)."""
        return None if self.unexposed else self.exposed_s

    @property
    def exposed_share(self) -> float | None:
        """Exposed %: the share of the step the loop waited inside collectives
        (exposed_s / duration_s) [fraction]; NA for a zero-length step or when some
        collective's wait was not measured."""
        if self.unexposed or self.duration_s <= 0:
            return None
        return self.exposed_s / self.duration_s

    @property
    def busbw(self) -> float | None:
        """Time-weighted busbw of all the step's collectives [bytes/s]; NA when some were
        untimed (as :attr:`OpTotals.busbw`)."""
        return None if self.untimed else busbw_of(self.bus_bytes, self.comm_s)

    @property
    def offload_bw(self) -> float | None:
        """Offload transfer bytes / transfer time [bytes/s]."""
        return self.offload_bytes / self.offload_s if self.offload_s > 0 else None

    @property
    def model_states(self) -> int | None:
        """P + G + O on the device [bytes]; NA when none of them was reported."""
        p, g, o = self.params, self.grads, self.optim
        if p is None and g is None and o is None:
            return None
        return (p or 0) + (g or 0) + (o or 0)

    @property
    def device_total(self) -> int | None:
        """P + G + O + A [bytes] (the parts reported); NA when none was. (Read for every rank
        of every closed step: written out, no lists.)"""
        p, g, o, a = self.params, self.grads, self.optim, self.activations
        if p is None and g is None and o is None and a is None:
            return None
        return (p or 0) + (g or 0) + (o or 0) + (a or 0)


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
        """Take a step report (replacing the latest; out-of-order old steps only add history)."""
        summary = summarize(report)
        if self.latest is None or report.step >= self.latest.step:
            self.latest, self.summary = report, summary
            if report.host is not None:
                self.host = report.host
        self.history.append(summary)
        self.totals.add(summary)
        self.dropped += report.dropped
        return summary
