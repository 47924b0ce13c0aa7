"""The measured figures a piece of advice predicts, and predicted vs measured for a trial.

``zeroscope advise TRACE --verify`` runs the job again with the change applied and compares
the figures of the two runs (both from the agent's own measurements, never the test's clock):

- step_ms: cluster mean step time over steady steps
- exposed_ms: the reference rank's wait in collectives per steady step (the median step's)
- fetch_wait_ms: the same, all-gathers only (stage-3 parameter fetch)
- skipped_ms: step time x the share of steps skipped for fp16 overflow (after settling)
- offload_ms: offload copy time per steady step
- model_state_bytes / activation_bytes / gathered_bytes / device_peak_bytes: the largest
  P+G+O, activation peak, stage-3 gathered peak and allocator peak (CUDA) over ranks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .facts import Facts
from .rules_run import skipped_after_settling

if TYPE_CHECKING:
    from zeroscope.state.cluster import ClusterState

    from .model import Advice


def measure(state: ClusterState) -> dict[str, float | None]:
    """Every figure named in the module docstring (None = not measured)."""
    f = Facts(state)
    step = f.step_s
    skipped, total, _ = skipped_after_settling(f)
    ref = f.reference
    offload = None
    if ref is not None:
        steps = f.steady(ref)
        offload = sum(s.offload_s for s in steps) / len(steps) * 1e3
    return {
        "step_ms": None if step is None else step * 1e3,
        "exposed_ms": f.exposed_s * 1e3 if ref is not None else None,
        "fetch_wait_ms": f.op("all_gather").exposed * 1e3 if ref is not None else None,
        "skipped_ms": None if step is None or not total else skipped / total * step * 1e3,
        "offload_ms": offload,
        "model_state_bytes": _f(f.model_states),
        "activation_bytes": _f(f.activations),
        "gathered_bytes": float(f.gathered) if ref is not None else None,
        "device_peak_bytes": _f(f.device_peak),
    }


def _f(v: int | None) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class Check:
    """One predicted figure against the trial: gains are positive when the trial saved."""

    metric: str
    before: float | None
    after: float | None
    predicted: float

    @property
    def measured(self) -> float | None:
        """before - after: what the change saved (ms or bytes)."""
        if self.before is None or self.after is None:
            return None
        return self.before - self.after

    @property
    def ratio(self) -> float | None:
        """measured / predicted gain."""
        m = self.measured
        return None if m is None or self.predicted == 0 else m / self.predicted

    @property
    def holds(self) -> bool | None:
        """The figure moved in the predicted direction by at least half the predicted amount."""
        r = self.ratio
        return None if r is None else r >= 0.5


def checks(
    advice: Advice, before: dict[str, float | None], after: dict[str, float | None]
) -> list[Check]:
    """The advice's predictions set against two runs' figures."""
    out = []
    if advice.ms_metric and advice.saves_ms is not None:
        m = advice.ms_metric
        out.append(Check(m, before.get(m), after.get(m), advice.saves_ms))
    if advice.bytes_metric and advice.saves_bytes is not None:
        m = advice.bytes_metric
        out.append(Check(m, before.get(m), after.get(m), advice.saves_bytes))
    return out
