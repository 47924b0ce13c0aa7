"""The advisor: from what was measured, which ds_config change buys how much memory or time.

A pure rule set over ClusterState (no I/O, no views). Each rule returns advice with its measured
evidence, the exact change (ds_config keys and values, or a code change) and its price from
measured quantities with the formula shown; or a :class:`NotJudged` naming the figures it lacks;
or nothing. docs/advisor.md lists every rule, its evidence, formula and sources.

| rule | module |
|---|---|
| 1 stage too high | rules_memory.lower_stage |
| 2 bucket sizes | rules_comm.buckets, rules_comm.held_bucket |
| 3 stage-3 prefetch | rules_comm.prefetch |
| 4 overlap_comm | rules_comm.overlap |
| 5 fp16 overflow storms | rules_run.fp16 |
| 6 activations / micro-batch ceiling | rules_memory.activations |
| 7 offload | rules_offload.offload |
| 8 batch triad, pipeline + ZeRO-2/3 | preflight.preflight (a ds_config; hf_batch: its "auto" keys as the HF Trainer fills them), rules_run.batch_triad |
| 9 zero.Init | rules_offload.zero_init |
| 10 stage-3 save without gathering | rules_offload.save_gather |
| 11 divergent collective sequences | rules_run.divergence (state/sequences.py) |
| 12 pipeline bubbles | rules_run.pipeline |

Advice priced in time also cites the run's tokens/s and MFU, and what the price makes of them
(throughput.throughput_evidence), NA with the reason where they were not measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from . import rules_comm, rules_memory, rules_offload, rules_run
from .facts import Facts
from .measure import Check, checks, measure
from .model import Advice, Change, Finding, NotJudged, Thresholds
from .preflight import preflight
from .throughput import run_throughput, throughput_evidence

if TYPE_CHECKING:
    from zeroscope.state.cluster import ClusterState

Rule = Callable[[Facts, Thresholds], "Finding | list[Finding] | None"]

RULES: tuple[tuple[str, Rule], ...] = (
    ("stage", rules_memory.lower_stage),
    ("buckets", rules_comm.buckets),
    ("buckets", rules_comm.held_bucket),
    ("prefetch", rules_comm.prefetch),
    ("overlap", rules_comm.overlap),
    ("fp16", rules_run.fp16),
    ("activations", rules_memory.activations),
    ("offload", rules_offload.offload),
    ("batch_triad", rules_run.batch_triad),
    ("zero_init", rules_offload.zero_init),
    ("save_gather", rules_offload.save_gather),
    ("divergence", rules_run.divergence),
    ("pipeline", rules_run.pipeline),
)


HEADLINE_MIN_GAIN = 0.01
"""Advice buying less than this share of the step (or of device memory) is not headlined."""

STAGE3_TUNING = frozenset({"prefetch"})
"""Rules that tune stage 3 itself: listed after rule 1 when a lower stage fits."""


@dataclass(frozen=True, slots=True)
class Advisory:
    """Everything the advisor concluded: advice sorted by gain, and the rules it could not
    judge (with what they lacked)."""

    advice: list[Advice] = field(default_factory=list)
    not_judged: list[NotJudged] = field(default_factory=list)

    @property
    def top(self) -> Advice | None:
        return self.advice[0] if self.advice else None

    @property
    def headline(self) -> Advice | None:
        """The advice worth a line on the cluster screen: the top one, unless what it buys is
        under ``HEADLINE_MIN_GAIN`` of the step (or of device memory). The demo's top advice
        saved 0.04 ms of a 17 ms step and was headlined as if it mattered; it stays listed,
        priced, on the Advice screen. Advice with no price at all is headlined (nothing says
        it is small)."""
        top = self.top
        if top is None or (math.isfinite(top.gain) and top.gain < HEADLINE_MIN_GAIN):
            return None
        return top


def gain(advice: Advice, f: Facts) -> float:
    """Errors first; then the larger of the time gain (saves_ms / step) and the memory gain
    (saves_bytes / device memory)."""
    if advice.severity == "error":
        return math.inf
    parts = []
    if advice.saves_ms is not None and f.step_s:
        parts.append(advice.saves_ms / 1e3 / f.step_s)
    if advice.saves_bytes is not None and f.capacity:
        parts.append(advice.saves_bytes / f.capacity)
    return max(parts) if parts else -math.inf


def advise(
    state: ClusterState, *, capacity: int | None = None, thresholds: Thresholds | None = None
) -> Advisory:
    """Run every rule over ``state``. ``capacity`` overrides the device memory the ranks
    reported (plan for another device, or a CPU run standing in for a GPU one). The rules'
    thresholds are the state's (``AlertRules.advice``) unless ``thresholds`` is given."""
    f = Facts(state, capacity=capacity)
    t = thresholds or state.rules.advice
    advice: list[Advice] = []
    notes: list[NotJudged] = []
    run = None
    for name, rule in RULES:
        try:
            found = rule(f, t)
        except (ArithmeticError, ValueError, LookupError, AttributeError, TypeError) as exc:
            found = NotJudged(name, f"the rule failed on these figures: {exc!r}")
        for item in found if isinstance(found, list) else [found]:
            if isinstance(item, Advice):
                if item.saves_ms is not None:  # priced in time: cite tokens/s and MFU too
                    run = run or run_throughput(f)
                    cite = throughput_evidence(item, run, f.step_s)
                    item = replace(item, evidence=item.evidence + ((cite,) if cite else ()))
                advice.append(replace(item, gain=gain(item, f)))
            elif isinstance(item, NotJudged):
                notes.append(item)
    stage = next((a for a in advice if a.rule == "stage"), None)
    if stage is not None:
        # The lower stage removes the fetches that prefetch tuning would only hide: when it
        # fits (rule 1 spoke), stage-3 tuning is listed after it.
        advice = [
            replace(a, gain=min(a.gain, stage.gain - 1e-9)) if a.rule in STAGE3_TUNING else a
            for a in advice
        ]
    advice.sort(key=lambda a: -a.gain)
    return Advisory(advice, notes)


__all__ = [
    "RULES",
    "Advice",
    "Advisory",
    "Change",
    "Check",
    "NotJudged",
    "Thresholds",
    "advise",
    "checks",
    "measure",
    "preflight",
]
