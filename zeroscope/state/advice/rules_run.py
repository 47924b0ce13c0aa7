"""Rules about the run itself: fp16 overflow storms (5), ranks whose collectives diverge (11),
pipeline bubbles (12), and the batch triad as the ranks reported it (8; the preflight check of a
ds_config file is in preflight.py)."""

from __future__ import annotations

import itertools
import math
from typing import Any

from zeroscope.state.pipeline import imbalance, mean_bubble, one_f_one_b_bound

from .facts import Facts
from .model import Advice, Change, Finding, NotJudged, Thresholds, ms

LOSS_RULE = "fp16"


def skipped_after_settling(f: Facts) -> tuple[int, int, int | None]:
    """(overflow steps, steps, first applied step) from the first applied step on: the initial
    descent from 2^initial_scale_power is calibration, not a storm."""
    steps = f.state.complete_steps()
    first = next((a.step for a in steps if not a.overflow), None)
    if first is None:
        return sum(a.overflow for a in steps), len(steps), None
    after = [a for a in steps if a.step >= first]
    return sum(a.overflow for a in after), len(after), first


def fp16(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 5: overflow storms or a loss scale stuck at its minimum."""
    c = f.config
    if c is None or c.precision != "fp16":
        return None
    step = f.step_s
    if step is None:
        return NotJudged(LOSS_RULE, "no steady step timed yet")
    skipped, total, first = skipped_after_settling(f)
    at_min = [e for e in f.state.events if e.event == "scale_at_minimum"]
    if total == 0:
        return None
    share = skipped / total
    scales = [a.loss_scale for a in f.state.complete_steps() if a.loss_scale]
    floor = bool(scales) and scales[-1] <= c.min_loss_scale and skipped > 0
    if not (at_min or floor) and (skipped < 2 or share < t.skipped_min):
        return startup_storm(f, t, first, step)
    waste = share * step
    evidence = [
        f"{skipped} of {total} steps skipped for overflow from step {first} on"
        if first is not None
        else f"every one of {total} steps overflowed",
        (f"loss scale {scales[0]:g} -> {scales[-1]:g}" if scales else "loss scale NA")
        + f" (min_loss_scale {c.min_loss_scale:g}, "
        f"window {c.loss_scale_window}, hysteresis {c.hysteresis}); step {ms(step)}",
    ]
    if at_min:
        evidence.append(f"step {at_min[0].step}: {at_min[0].message}")
    elif floor:
        evidence.append(f"the loss scale is at its minimum {c.min_loss_scale:g} and still skips")
    overflow_steps = [
        a.step for a in f.state.complete_steps() if a.overflow and a.step >= (first or 0)
    ]
    gaps = {b - a for a, b in itertools.pairwise(overflow_steps)}
    probing = (
        not (at_min or floor)
        and len(gaps) == 1
        and abs(next(iter(gaps)) - (c.loss_scale_window + 1)) <= 1
    )
    if probing:
        window = c.loss_scale_window * 4
        saved = waste * 3 / 4
        return Advice(
            rule=LOSS_RULE,
            title="the loss scale overflows at every growth probe: a longer window",
            evidence=(*evidence, f"overflows every {next(iter(gaps))} steps = the window + 1"),
            change=Change({"fp16.loss_scale_window": window}),
            formula=f"saves_ms = skipped share * step * (1 - 1/4) = {share:.3f} * {ms(step)} * "
            f"3/4 = {ms(saved)}",
            confidence="medium",
            saves_ms=saved * 1e3,
            ms_metric="skipped_ms",
        )
    return Advice(
        rule=LOSS_RULE,
        title="fp16 overflow storm: train in bf16 (fp32's range, no loss scaling)",
        evidence=tuple(evidence),
        change=Change({"bf16.enabled": True, "fp16.enabled": False}),
        formula=f"saves_ms = skipped share * step = {share:.3f} * {ms(step)} = {ms(waste)} "
        "(bf16 has fp32's 8 exponent bits: these gradients do not overflow; same bytes; "
        "needs bf16 hardware on CUDA, compute capability 8.0+)",
        confidence="high" if f.state.device in ("", "cpu") else "medium",
        severity="error" if at_min or floor else "advice",
        saves_ms=waste * 1e3,
        ms_metric="skipped_ms",
    )


def startup_storm(f: Facts, t: Thresholds, first: int | None, step: float) -> Finding | None:
    """Rule 5, at start-up: every step before the first applied one overflowed while the loss
    scale came down from 2^initial_scale_power. A few such steps are the scaler calibrating; many
    are a run paying whole steps for a start too high. Priced once per run: the skipped steps'
    time, and the change is the power the scale settled at (a start there skips none)."""
    c = f.config
    steps = f.state.complete_steps()
    if c is None or first is None:
        return None
    lead = [a for a in steps if a.step < first]
    if len(lead) < t.startup_skipped_min:
        return None
    settled = next((a.loss_scale for a in steps if a.step == first), None)
    if not settled or settled <= 0:
        return NotJudged(LOSS_RULE, "no loss scale reported at the first applied step")
    power = max(math.floor(math.log2(settled)), 0)
    lost = len(lead) * step
    per_step = lost / len(steps)
    return Advice(
        rule=LOSS_RULE,
        title=f"start-up overflow storm: start the loss scale at 2^{power}",
        evidence=(
            f"steps {lead[0].step}-{lead[-1].step}: {len(lead)} of {len(steps)} steps skipped "
            f"for overflow before the first applied step ({first})",
            f"the loss scale settled at {settled:g} = 2^{math.log2(settled):g} from "
            f"initial_scale_power {c.initial_scale_power}; step {ms(step)}",
        ),
        change=Change({"fp16.initial_scale_power": power}),
        formula=f"lost = skipped start-up steps * step = {len(lead)} * {ms(step)} = {ms(lost)} "
        f"once per run; saves_ms = {ms(lost)} / {len(steps)} steps = {ms(per_step)} a step "
        "over this run",
        confidence="high",
        saves_ms=per_step * 1e3,
        ms_metric="skipped_ms",
    )


def divergence(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 11: a rank's collective sequence diverged from the others'."""
    book = f.state.sequences
    if not book.divergences:
        return None
    first = book.divergences[0]
    evidence = [
        f"step {first.step}: rank{'s' if len(first.ranks) > 1 else ''} "
        f"{', '.join(map(str, first.ranks))} issued a different collective sequence than rank"
        f"{'s' if len(first.reference) > 1 else ''} {', '.join(map(str, first.reference))}",
        first.detail,
    ]
    if book.count > 1:
        evidence.append(f"{book.count} divergent steps, the last {book.divergences[-1].step}")
    return Advice(
        rule="divergence",
        title=f"rank {first.ranks[0]}'s collectives diverge from the others' (a hang or mixed "
        "data)",
        evidence=tuple(evidence),
        change=Change(
            code="every rank must issue the same collectives in the same order: no "
            "data-dependent skips or reorders of sharded modules (stage 3: "
            "deepspeed.utils.set_z3_leaf_modules for MoE-style routing), the same number of "
            "micro-batches per rank (DistributedSampler with drop_last)"
        ),
        formula="no saving: collectives matched across different tensors either hang or "
        "exchange the wrong data",
        confidence="high",
        severity="error",
        ranks=first.ranks,
    )


def _has_batch_triad(engine: str) -> bool:
    """The engine reads train_batch_size, micro-batch and accumulation from a ds_config (or
    the HF Trainer's arguments): "" is a trace from before Hellos named the engine (the bundled
    engine's)."""
    return not engine or engine == "zeroscope" or "deepspeed" in engine or "hf-trainer" in engine


def batch_triad(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 8 on a trace: the batch sizes the ranks reported must multiply out. Only for the
    engines that have the triad (DeepSpeed, the bundled engine): a DDP or FSDP2 loop reports no
    batch sizes, and the schema's defaults are no reading of it."""
    c = f.config
    if c is None or not c.train_batch_size or not _has_batch_triad(f.state.engine):
        return None
    product = c.micro_batch_size * c.gradient_accumulation_steps * c.dp_world_size
    if product == c.train_batch_size:
        return None
    return Advice(
        rule="batch_triad",
        title="train_batch_size != micro x accumulation x data-parallel size",
        evidence=(
            f"reported: train_batch_size {c.train_batch_size}, micro {c.micro_batch_size}, "
            f"accumulation {c.gradient_accumulation_steps}, data-parallel {c.dp_world_size}",
        ),
        change=Change({"train_batch_size": product}),
        formula=f"{c.micro_batch_size} x {c.gradient_accumulation_steps} x {c.dp_world_size} = "
        f"{product}",
        confidence="high",
        severity="error",
    )


def pipeline(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 12: a pipeline bubble above the 1F1B bound, or unbalanced stages. Reads the
    pipeline telemetry (Hello.parallel, StepReport.pipeline) where this schema has it."""
    hellos = [r.hello for r in f.state.ranks.values() if r.hello is not None]
    if not hellos:
        return None
    if not hasattr(hellos[0], "parallel"):
        return NotJudged(
            "pipeline",
            "this wire schema has no pipeline telemetry (Hello.parallel, StepReport.pipeline)",
        )
    layouts: list[Any] = [getattr(h, "parallel", None) for h in hellos]
    layout = next((x for x in layouts if x is not None and x.pp_size > 1), None)
    if layout is None:
        return None
    stages, micro = layout.pp_size, max(1, layout.microbatches)
    rows = []
    for r in f.state.ranks.values():
        pipe = getattr(r.latest, "pipeline", None) if r.latest is not None else None
        par = getattr(r.hello, "parallel", None) if r.hello is not None else None
        if pipe is None or par is None or pipe.step_s <= 0:
            continue
        busy = sum(a.duration_s for a in pipe.actions)
        rows.append((r.rank, par.pp, pipe.step_s, busy))
    if not rows:
        return NotJudged(
            "pipeline",
            "no rank timed its stage's forward and backward actions (StepReport.pipeline: the "
            "bundled engine's pipeline does; an attached pipeline job reports its stages, not "
            "their actions), so the bubble and the stages' balance are not measured",
        )
    span = max(s for _, _, s, _ in rows)
    bubble = mean_bubble(span, (b for *_, b in rows)) or 0.0  # span > 0: never NA here
    bound = one_f_one_b_bound(stages, micro) or 0.0  # stages > 1, micro >= 1: never NA
    by_stage: dict[int, list[float]] = {}
    for _, pp, _, busy in rows:
        by_stage.setdefault(pp, []).append(busy)
    loads = {pp: sum(v) / len(v) for pp, v in by_stage.items()}
    mean_load = sum(loads.values()) / len(loads)
    slowest = max(loads, key=lambda k: loads[k])
    ratio = imbalance(loads.values())
    step = f.latest.step if f.latest else "?"
    evidence = (
        f"step {step}: bubble {bubble:.0%} of a {ms(span)} pipeline step vs the 1F1B bound "
        f"(p-1)/(m+p-1) = ({stages}-1)/({micro}+{stages}-1) = {bound:.0%}",
        "stage compute: "
        + ", ".join(f"stage {pp} {ms(v)}" for pp, v in sorted(loads.items()))
        + f"; slowest stage {slowest}",
    )
    if ratio is not None and ratio > t.stage_imbalance:
        saves = loads[slowest] - mean_load
        return Advice(
            rule="pipeline",
            title=f"unbalanced pipeline: stage {slowest} is the bottleneck",
            evidence=evidence,
            change=Change(
                code="partition by measured layer time (PipelineModule "
                "partition_method='parameters' or a measured 'type:' split)"
            ),
            formula=f"saves_ms = slowest stage - mean stage = {ms(loads[slowest])} - "
            f"{ms(mean_load)} = {ms(saves)}",
            confidence="medium",
            saves_ms=saves * 1e3,
            ms_metric="step_ms",
        )
    if bubble > bound + t.bubble_excess or bound > t.bubble_bound_max:
        after = one_f_one_b_bound(stages, 2 * micro) or 0.0
        saves = (bubble - after) * span
        return Advice(
            rule="pipeline",
            title="pipeline bubble: twice the micro-batches",
            evidence=evidence,
            change=Change({"gradient_accumulation_steps": 2 * micro}),
            formula=f"saves_ms = (bubble - (p-1)/(2m+p-1)) * step = ({bubble:.2f} - "
            f"{after:.2f}) * {ms(span)} = {ms(saves)} (same global batch: halve the micro-batch)",
            confidence="low",
            saves_ms=saves * 1e3,
            ms_metric="step_ms",
        )
    return None
