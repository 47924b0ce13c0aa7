"""The run's tokens/s and MFU in the evidence of advice priced in time: what a training user
reasons in, beside the milliseconds (offload's cost in MFU points, a prefetch's gain).

The figures are the run's over its steady steps (zeroscope.state.throughput.cluster_run, the
summary's). A change priced at ``saves_ms`` leaves the step's tokens and model FLOPs as they
are and changes its time, so both scale by step / (step - saved): the evidence states the
run's figures, and what they would be, with the step time the price was computed on. A figure
nobody measured is NA with the reason (no tokens reported, FLOPs not counted, no peak), never
left out silently.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zeroscope.state import units
from zeroscope.state.throughput import Throughput, cluster_run

if TYPE_CHECKING:
    from .facts import Facts
    from .model import Advice


def run_throughput(f: Facts) -> Throughput:
    """The run's figures the evidence cites (computed once per advise)."""
    return cluster_run(f.state)


def throughput_evidence(advice: Advice, run: Throughput, step_s: float | None) -> str | None:
    """The evidence line for ``advice`` (None when it has no time price)."""
    if advice.saves_ms is None or advice.severity == "error":
        return None
    tokens, mfu = run.tokens_per_s, run.mfu
    if tokens is None and mfu is None:
        return f"the run's tokens/s and MFU: NA ({run.na or 'not measured'})"
    now = f"the run: {units.count(tokens)} tokens/s, MFU {units.fine_percent(mfu)}"
    if mfu is None:
        now += f" ({run.na or 'not measured'})"
    if run.over:
        now += f" ({run.over})"
    if not step_s or step_s * 1e3 <= advice.saves_ms:
        return now + " (steady steps)"
    scale = step_s / (step_s - advice.saves_ms / 1e3)
    after = []
    if tokens is not None:
        after.append(f"{units.count(tokens * scale)} tokens/s")
    if mfu is not None and mfu * scale > 1.0:
        after.append("MFU NA (the projection passes the peak: the same work cannot fit)")
    elif mfu is not None:
        points = 100 * mfu * (scale - 1)
        after.append(f"MFU {units.fine_percent(mfu * scale)} ({points:+.2g} points)")
    return (
        f"{now} (steady steps); the same tokens and FLOPs in a step "
        f"{'shorter' if advice.saves_ms > 0 else 'longer'} by {abs(advice.saves_ms):.3g} ms "
        f"of {step_s * 1e3:.3g} ms: {', '.join(after)}"
    )
