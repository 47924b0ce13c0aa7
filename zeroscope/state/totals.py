"""Whole-run aggregates, per rank and for the cluster: what ``zeroscope summary`` prints and what
the live summary line, ``replay --headless`` and ``export`` report, from one definition.

Time and communication figures are over *steady* steps: every step but the first (a rank's
first report; the cluster's first complete step). The first step carries one-off traffic and
time (initial broadcasts, stage 3's recording step with its double gathers, allocator and JIT
warm-up) that would otherwise be folded into per-step figures. A run of a single step uses it.
Peaks and counts cover every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .bandwidth import busbw_of

if TYPE_CHECKING:
    from .rank import StepSummary


NO_SAMPLES = (
    "no rank reported its samples: they are read from DeepSpeed, the HF Trainer and the "
    "bundled engine; a DDP, FSDP or plain loop's batch is its script's (tokens/s counts its work)"
)
"""Why samples/s is NA for a run whose steps have a span (ClusterTotals.samples_na)."""


@dataclass(slots=True)
class _Sums:
    steps: int = 0
    duration_s: float = 0.0
    exposed_s: float = 0.0
    comm_volume: int = 0
    comm_s: float = 0.0
    bus_bytes: float = 0.0
    collectives: int = 0
    offload_bytes: int = 0
    offload_s: float = 0.0
    unexposed: int = 0
    """Collectives whose exposed time was not measured (the exposed share is then NA)."""
    untimed: int = 0
    """Collectives no clock measured (busbw is then NA)."""

    def add(self, s: StepSummary) -> None:
        self.steps += 1
        self.unexposed += s.unexposed
        self.untimed += s.untimed
        self.duration_s += s.duration_s
        self.exposed_s += s.exposed_s
        self.comm_volume += s.comm_volume
        self.comm_s += s.comm_s
        self.bus_bytes += s.bus_bytes
        self.collectives += s.collectives
        self.offload_bytes += s.offload_bytes
        self.offload_s += s.offload_s


@dataclass(slots=True)
class RankTotals:
    """One rank over the run (fed every StepSummary it reports)."""

    steps: int = 0
    first_step: int | None = None
    params_peak: int | None = None
    frozen_params_peak: int | None = None
    """Of P: the most bytes of frozen parameters held (None: never said)."""
    grads_peak: int | None = None
    optim_peak: int | None = None
    activations_peak: int | None = None
    host_peak: int | None = None
    device_peak: int | None = None
    overflows: int = 0
    _first: _Sums | None = None
    _steady: _Sums | None = None

    def add(self, s: StepSummary) -> None:
        # Each peak is the largest value reported (None until one is), written out: every
        # report of every rank comes through here.
        self.steps += 1
        if (v := s.params) is not None and (self.params_peak is None or v > self.params_peak):
            self.params_peak = v
        if (v := s.frozen_params) is not None and (
            self.frozen_params_peak is None or v > self.frozen_params_peak
        ):
            self.frozen_params_peak = v
        if (v := s.grads) is not None and (self.grads_peak is None or v > self.grads_peak):
            self.grads_peak = v
        if (v := s.optim) is not None and (self.optim_peak is None or v > self.optim_peak):
            self.optim_peak = v
        if (v := s.activations) is not None and (
            self.activations_peak is None or v > self.activations_peak
        ):
            self.activations_peak = v
        if (v := s.host_bytes) is not None and (self.host_peak is None or v > self.host_peak):
            self.host_peak = v
        if (v := s.device_peak) is not None and (self.device_peak is None or v > self.device_peak):
            self.device_peak = v
        self.overflows += s.overflow
        if self._first is None:
            self.first_step = s.step
            self._first = _Sums()
            self._first.add(s)
        else:
            if self._steady is None:
                self._steady = _Sums()
            self._steady.add(s)

    @property
    def _sums(self) -> _Sums | None:
        return self._steady or self._first

    @property
    def mean_step_s(self) -> float | None:
        """Mean step time over steady steps [s]."""
        s = self._sums
        return s.duration_s / s.steps if s and s.steps else None

    @property
    def comm_bytes_per_step(self) -> float | None:
        """Mean communication volume per steady step (bandwidth.volume) [bytes]."""
        s = self._sums
        return s.comm_volume / s.steps if s and s.collectives else None

    @property
    def exposed_share(self) -> float | None:
        """Exposed %: time waiting in collectives / step time, over steady steps [fraction];
        NA when some collective's wait was not measured."""
        s = self._sums
        if not s or not s.collectives or s.unexposed or s.duration_s <= 0:
            return None
        return s.exposed_s / s.duration_s

    @property
    def busbw(self) -> float | None:
        """Time-weighted busbw of every steady-step collective [bytes/s]; NA when some were
        untimed (the timed part would pass for the whole)."""
        s = self._sums
        return busbw_of(s.bus_bytes, s.comm_s) if s and not s.untimed else None

    @property
    def offload_bw(self) -> float | None:
        """Offload bytes / offload time over steady steps [bytes/s]."""
        s = self._sums
        return s.offload_bytes / s.offload_s if s and s.offload_s > 0 else None

    def sums(self) -> _Sums | None:
        """The steady-step sums (the first step's when it is the only one)."""
        return self._sums


@dataclass(slots=True)
class ClusterTotals:
    """The cluster over the run, fed every complete step (see ClusterState)."""

    steps: int = 0
    first_step: int | None = None
    first_wall_ns: int | None = None
    last_wall_ns: int | None = None
    step_time_s: float = 0.0
    """Sum of steady cluster step times (each the slowest rank's) [s]."""
    exposed_s: float = 0.0
    """Sum over steady steps of the cluster's exposed time (the least-exposed rank's) [s]."""
    samples: int = 0
    """Samples of the steady steps (every rank's share added up)."""
    skipped: int = 0
    overflows: int = 0
    unexposed_steps: int = 0
    """Steady steps whose exposed time was not measured on some rank (the share is NA)."""
    comm_steps: int = 0
    """Steady steps in which some rank reported a collective: with none, the exposed share is
    NA (as each rank's is), not 0 % of nothing."""

    first_step_time_s: float = 0.0
    last_step: int | None = None
    grad_norm_final: float | None = None
    """The newest step's gradient norm (the largest rank's; NA where none reported one)."""
    grad_norm_max: float | None = None
    grad_norm_max_step: int | None = None
    """The largest finite gradient norm of the run and its step: the spike to look at (an
    overflowed fp16 step's inf or nan is no spike: its update was skipped)."""
    thinned: bool = False
    """The trace was thinned (store/thinning.py): the steps between the kept ones ran but were
    not recorded, so the rates count step numbers, not the steps seen, and samples/s scales the
    kept steps' mean samples by them."""

    def add(
        self,
        *,
        step: int,
        wall_ns: int,
        step_time: float,
        exposed: float | None,
        samples: int,
        skipped: bool,
        overflow: bool,
        exposed_unmeasured: bool = False,
        grad_norm: float | None = None,
    ) -> None:
        self.steps += 1
        self.grad_norm_final = grad_norm
        best = self.grad_norm_max
        if (
            grad_norm is not None
            and math.isfinite(grad_norm)
            and (best is None or grad_norm > best)
        ):
            self.grad_norm_max, self.grad_norm_max_step = grad_norm, step
        self.skipped += skipped
        self.overflows += overflow
        if self.first_step is None:
            self.first_step, self.first_wall_ns = step, wall_ns
            self.first_step_time_s = step_time
        else:
            self.step_time_s += step_time
            self.exposed_s += exposed or 0.0
            self.unexposed_steps += exposed_unmeasured
            self.comm_steps += exposed is not None or exposed_unmeasured
            self.samples += samples
        self.last_wall_ns = wall_ns
        self.last_step = step

    @property
    def periods(self) -> int:
        """Steady steps the span covers: the steps seen after the first, or with a thinned
        trace the step numbers from the first to the last."""
        if self.thinned and self.first_step is not None and self.last_step is not None:
            return self.last_step - self.first_step
        return self.steps - 1

    @property
    def span_s(self) -> float | None:
        """From the end of the first complete step to the end of the last [s]."""
        if self.first_wall_ns is None or self.last_wall_ns is None:
            return None
        span = (self.last_wall_ns - self.first_wall_ns) / 1e9
        return span if span > 0 else None

    @property
    def steps_per_s(self) -> float | None:
        """Optimizer steps per second over the run: (steps - 1) / span [1/s]."""
        span = self.span_s
        return self.periods / span if span else None

    @property
    def samples_per_s(self) -> float | None:
        """Samples per second over the run: the steady steps' samples / span [samples/s];
        NA when no rank reports samples."""
        span = self.span_s
        if not span or not self.samples:
            return None
        if self.thinned and self.steps > 1:
            return self.samples / (self.steps - 1) * self.periods / span
        return self.samples / span

    @property
    def samples_na(self) -> str:
        """Why ``samples_per_s`` is NA while the run's steps have a span ("" otherwise)."""
        return NO_SAMPLES if self.span_s and not self.samples else ""

    @property
    def mean_step_s(self) -> float | None:
        """Mean cluster step time over steady steps [s]: the span between the first and the last
        step end over the steps in it, so it is 1 / ``steps_per_s`` exactly. The mean of each
        step's slowest rank overstates it where ranks' step ends are not aligned (DDP: a rank
        that ends step n late ends step n+1 early, and the max picks the late one every step:
        42 ms beside 29.7 steps/s). Without a span, the summed slowest ranks' times; the first
        step's if it is the only."""
        n = self.steps - 1
        if n <= 0:
            return self.first_step_time_s if self.steps else None
        span = self.span_s
        return span / self.periods if span else self.step_time_s / n

    @property
    def exposed_share(self) -> float | None:
        """The cluster's exposed % over steady steps: sum of each step's least-exposed rank's
        wait / sum of step times [fraction]; NA when a steady step's wait was not measured, or
        when no steady step had a collective (a job whose ranks never communicate)."""
        if self.unexposed_steps or not self.comm_steps or self.step_time_s <= 0:
            return None
        return self.exposed_s / self.step_time_s
