"""One rank as the viewer knows it: identity, the latest full report and a compact history.

History keeps a :class:`StepSummary` per step (a few dozen numbers), not the whole StepReport:
1024 ranks x a long window of full reports with hundreds of collectives each would cost
gigabytes. The latest full report is kept for the drill-down timeline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from zeroscope.agent.metrics import bus_factor
from zeroscope.agent.schema import Bye, Hello, StepReport

HISTORY_STEPS = 512
"""Steps of per-rank history kept for the over-time charts."""


@dataclass(slots=True)
class OpTotals:
    """One collective op's totals within a step (the rank-detail table's row)."""

    count: int = 0
    nbytes: int = 0
    seconds: float = 0.0
    exposed_s: float = 0.0
    bus_bytes: float = 0.0
    """Sum of nbytes x the nccl-tests bus factor of each collective (its group size)."""

    @property
    def busbw(self) -> float | None:
        """Bus bandwidth over the op's total time: sum(S·factor) / sum(t), i.e. each
        collective's busbw (agent.metrics) weighted by its time."""
        return self.bus_bytes / self.seconds if self.seconds > 0 else None


@dataclass(slots=True)
class StepSummary:
    """What the over-time views need of one rank's step."""

    step: int
    wall_ns: int
    duration_s: float
    params: int
    grads: int
    optim: int
    activations: int | None
    host_bytes: int
    comm_volume: int
    """Sum of collectives' nbytes in the 2Ψ/3Ψ convention (an all-reduce counts twice)."""
    comm_s: float
    exposed_s: float
    offload_bw: float | None
    loss: float | None
    loss_scale: float | None
    overflow: bool
    ops: dict[str, OpTotals]

    @property
    def exposed_share(self) -> float | None:
        return self.exposed_s / self.duration_s if self.duration_s > 0 else None

    @property
    def model_states(self) -> int:
        return self.params + self.grads + self.optim

    @property
    def device_total(self) -> int:
        return self.model_states + (self.activations or 0)


def summarize(report: StepReport) -> StepSummary:
    ops: dict[str, OpTotals] = {}
    volume = 0
    comm_s = exposed = 0.0
    factors: dict[tuple[str, int], float] = {}
    for c in report.collectives:
        op = c.op
        totals = ops.get(op)
        if totals is None:
            totals = ops[op] = OpTotals()
        totals.count += 1
        totals.nbytes += c.nbytes
        totals.seconds += c.duration_s
        totals.exposed_s += c.exposed_s
        key = (op, c.group_size)
        factor = factors.get(key)
        if factor is None:
            factor = factors[key] = bus_factor(op, max(1, c.group_size))
        totals.bus_bytes += c.nbytes * factor
        volume += 2 * c.nbytes if op == "all_reduce" else c.nbytes  # formulas.volume_equivalent
        comm_s += c.duration_s
        exposed += c.exposed_s
    moved = sum(t.nbytes for t in report.transfers)
    moving = sum(t.duration_s for t in report.transfers)
    m = report.memory
    return StepSummary(
        step=report.step,
        wall_ns=report.wall_ns,
        duration_s=report.duration_s,
        params=m.params,
        grads=m.grads,
        optim=m.optim,
        activations=m.activations,
        host_bytes=m.host_params + m.host_grads + m.host_optim,
        comm_volume=volume,
        comm_s=comm_s,
        exposed_s=exposed,
        offload_bw=moved / moving if moving > 0 else None,
        loss=report.loss,
        loss_scale=report.loss_scale,
        overflow=report.overflow,
        ops=ops,
    )


@dataclass(slots=True)
class RankState:
    rank: int
    hello: Hello | None = None
    latest: StepReport | None = None
    summary: StepSummary | None = None
    history: deque[StepSummary] = field(default_factory=lambda: deque(maxlen=HISTORY_STEPS))
    last_seen_s: float | None = None
    dropped: int = 0
    bye: Bye | None = None
    straggling_steps: int = 0
    """Consecutive completed steps on which this rank was an outlier (median + k·MAD)."""

    @property
    def hostname(self) -> str:
        return self.hello.hostname if self.hello else ""

    def record(self, report: StepReport) -> StepSummary:
        """Take a step report (replacing the latest; out-of-order old steps only add history)."""
        summary = summarize(report)
        if self.latest is None or report.step >= self.latest.step:
            self.latest, self.summary = report, summary
        self.history.append(summary)
        self.dropped += report.dropped
        return summary
