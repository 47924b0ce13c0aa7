"""The measured figures the rules read, taken once from ClusterState.

Per-step figures are medians over steady steps (every step of a rank but its first, as
zeroscope.state.totals does; a median, so that a step whose peer was descheduled does not set
them) on the *reference rank*: the rank that waited least in collectives,
because the other ranks' extra wait is waiting for slower peers, not communication cost (the
cluster's exposed time is defined the same way, zeroscope.state.cluster). Memory figures are the
largest over ranks (the rank that runs out first). Detail that only the newest full report holds
(each collective's size and time, phases) is read from the reference rank's newest report.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from zeroscope.state.bandwidth import wire_bytes

if TYPE_CHECKING:
    from zeroscope.agent.schema import Collective, ConfigSummary, ParamCounts, StepReport
    from zeroscope.state.cluster import ClusterState
    from zeroscope.state.rank import OpTotals, RankState, StepSummary


@dataclass(frozen=True, slots=True)
class OpMeans:
    """One collective op on the reference rank, per steady step (medians over the steps)."""

    count: float
    nbytes: float
    """Message bytes S (nccl-tests convention) [bytes]."""
    seconds: float
    """Issue-to-completion time [s]."""
    exposed: float
    """Time the loop waited for them [s]."""


NO_OP = OpMeans(0.0, 0.0, 0.0, 0.0)

WINDOW = 32
"""Steady steps per rank the means are taken over (the newest), so advice follows the run and
stays cheap at 1024 ranks."""


class Facts:
    """Figures of one ClusterState for the rules (see the module docstring)."""

    def __init__(self, state: ClusterState, *, capacity: int | None = None) -> None:
        self.state = state
        self.config: ConfigSummary | None = state.config
        self.params: ParamCounts | None = state.params
        self._capacity_override = capacity

    # -- which steps and which rank ------------------------------------------------------------

    def steady(self, rank: RankState) -> list[StepSummary]:
        """The rank's newest WINDOW steady steps (its first step left out unless it is the
        only one)."""
        history = list(rank.history)[-WINDOW - 1 :]
        first = rank.totals.first_step
        steady = [s for s in history if s.step != first]
        return steady or history

    @cached_property
    def reference(self) -> RankState | None:
        """The reporting rank that waited least in collectives per steady step."""
        ranks = [r for r in self.state.ranks.values() if r.history]
        if not ranks:
            return None

        def wait(r: RankState) -> tuple[float, int]:
            steps = self.steady(r)
            return (sum(s.exposed_s for s in steps) / len(steps), r.rank)

        return min(ranks, key=wait)

    @cached_property
    def steps_text(self) -> str:
        """ "steps 2-10 of rank 0" for evidence lines."""
        ref = self.reference
        if ref is None:
            return "no steps"
        steps = self.steady(ref)
        span = (
            f"step {steps[0].step}"
            if len(steps) == 1
            else f"steps {steps[0].step}-{steps[-1].step}"
        )
        return f"{span} of rank {ref.rank}"

    @property
    def latest(self) -> StepReport | None:
        ref = self.reference
        return ref.latest if ref is not None else None

    # -- time ----------------------------------------------------------------------------------

    @cached_property
    def step_s(self) -> float | None:
        """Mean cluster step time over steady steps [s] (the slowest rank's each step)."""
        return self.state.totals.mean_step_s

    def op(self, op: str) -> OpMeans:
        """``op`` per steady step on the reference rank: the median step's figures, so that a
        step whose peer was descheduled (a long wait in one collective) does not set them."""
        ref = self.reference
        if ref is None:
            return NO_OP
        rows = [s.ops.get(op) for s in self.steady(ref)]
        if not any(rows):
            return NO_OP

        def med(get: Callable[[OpTotals], float]) -> float:
            return statistics.median(get(r) if r is not None else 0.0 for r in rows)

        return OpMeans(
            count=med(lambda r: r.count),
            nbytes=med(lambda r: r.nbytes),
            seconds=med(lambda r: r.seconds),
            exposed=med(lambda r: r.exposed_s),
        )

    @cached_property
    def exposed_s(self) -> float:
        """The reference rank's wait in collectives per steady step, the median step's [s]."""
        ref = self.reference
        if ref is None:
            return 0.0
        return statistics.median(s.exposed_s for s in self.steady(ref))

    @cached_property
    def compute_s(self) -> float | None:
        """Step time minus the wait in collectives [s]."""
        return None if self.step_s is None else max(self.step_s - self.exposed_s, 0.0)

    def collectives(self, op: str) -> list[Collective]:
        """The reference rank's newest report's collectives of ``op``."""
        latest = self.latest
        return [c for c in latest.collectives if c.op == op] if latest is not None else []

    def phase_s(self, name: str) -> float | None:
        """The reference rank's newest report's time in a phase [s] (NA when not reported)."""
        latest = self.latest
        return getattr(latest.phases, name, None) if latest is not None else None

    # -- memory --------------------------------------------------------------------------------

    def _max(self, values: list[int | None]) -> int | None:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    @cached_property
    def model_states(self) -> int | None:
        """Largest P + G + O on any rank's device [bytes] (newest step)."""
        return self._max([r.summary.model_states for r in self._summarized if r.summary])

    @cached_property
    def activations(self) -> int | None:
        """Largest activation peak on any rank [bytes]."""
        return self._max([r.totals.activations_peak for r in self._summarized])

    @cached_property
    def gathered(self) -> int:
        """Largest stage-3 gathered-parameter peak on any rank [bytes]."""
        return max((s.gathered_params for r in self._summarized for s in self.steady(r)), default=0)

    @cached_property
    def device_peak(self) -> int | None:
        """Largest allocator peak on any rank (CUDA) [bytes]; NA on the CPU."""
        return self._max([r.totals.device_peak for r in self._summarized])

    @cached_property
    def used(self) -> int | None:
        """Peak device bytes in use: the allocator's peak where measured, else P+G+O + A +
        gathered parameters (the parts the engine and the agent count)."""
        if self.device_peak is not None:
            return self.device_peak
        if self.model_states is None:
            return None
        return self.model_states + (self.activations or 0) + self.gathered

    @cached_property
    def capacity(self) -> int | None:
        """This rank's device memory [bytes]: the override, else the smallest a rank reported
        (Hello.device_memory_bytes, or the GPU sampler's total)."""
        if self._capacity_override:
            return self._capacity_override
        said = [
            r.hello.device_memory_bytes
            for r in self.state.ranks.values()
            if r.hello is not None and r.hello.device_memory_bytes
        ]
        sampled = [
            r.host.gpu_mem_total_bytes
            for r in self.state.ranks.values()
            if r.host is not None and r.host.gpu_mem_total_bytes
        ]
        known = said or sampled
        return min(known) if known else None

    @cached_property
    def capacity_text(self) -> str:
        if self._capacity_override:
            return "the device memory given (--device-memory)"
        return "the device memory the ranks reported"

    @cached_property
    def headroom(self) -> int | None:
        """Capacity minus peak use [bytes]; NA without both."""
        if self.capacity is None or self.used is None:
            return None
        return self.capacity - self.used

    @cached_property
    def _summarized(self) -> list[RankState]:
        return [r for r in self.state.ranks.values() if r.summary is not None]

    def latest_memory_field(self, name: str) -> int:
        """The largest value of a MemoryBytes field in the ranks' newest reports."""
        values = [getattr(r.latest.memory, name, 0) or 0 for r in self._summarized if r.latest]
        return max(values, default=0)

    # -- run -----------------------------------------------------------------------------------

    @cached_property
    def steady_steps(self) -> int:
        ref = self.reference
        return len(self.steady(ref)) if ref is not None else 0

    def median(self, values: list[float]) -> float | None:
        return statistics.median(values) if values else None


def hockney(f: Facts) -> tuple[float, float | None]:
    """(alpha [s], beta [bytes/s]) of Hockney's t = alpha + S / beta for this rank's links:
    alpha the median all-gather's time (a per-collective cost with the usual wait for peers
    in it), beta the time-weighted bus bandwidth of the step's largest messages (at least half
    the largest size: the bandwidth regime), from the reference rank's newest report; None
    when nothing is measurable."""
    latest = f.latest
    colls = [
        c for c in (latest.collectives if latest else []) if c.duration_s > 0 and c.nbytes > 64
    ]
    gathers = [c.duration_s for c in colls if c.op == "all_gather"]
    alpha = statistics.median(gathers) if gathers else 0.0
    if not colls:
        return alpha, None
    biggest = max(c.nbytes for c in colls)
    large = [c for c in colls if 2 * c.nbytes >= biggest]
    wire = sum(wire_bytes(c.op, c.nbytes, c.group_size) for c in large)
    return alpha, wire / sum(c.duration_s for c in large)
