"""Rules that trade memory: the ZeRO stage (1), activation checkpointing and the micro-batch
ceiling (6), offload (7), ``zero.Init`` (9) and 16-bit saves at stage 3 (10).

Model-state bytes at another stage come from the ZeRO formulas (zeroscope.state.formulas, the ones the
engine's accounting is tested against); everything else is measured.
"""

from __future__ import annotations

import math

from zeroscope.state.formulas import ModelStateBytes, model_state_bytes, param_bytes

from .facts import Facts, hockney
from .model import Advice, Change, Finding, NotJudged, Thresholds, ms, nbytes


def states_at(f: Facts, stage: int, *, offload: str | None = None) -> ModelStateBytes:
    """Predicted P+G+O per rank of this job at ``stage`` (offload_param only at stage 3)."""
    c, p = f.config, f.params
    assert c is not None and p is not None
    opt = c.offload_optimizer if offload is None else offload
    par = c.offload_param if stage == 3 and offload is None else "none"
    return model_state_bytes(
        p.total,
        c.dp_world_size,
        stage,
        c.precision,
        opt if stage > 0 else "none",
        par,
        persistent=p.persistent if stage == 3 else 0,
    )


def fits(f: Facts, extra: float, t: Thresholds) -> tuple[bool | None, str]:
    """Whether adding ``extra`` bytes keeps peak use under the fit fraction of device memory;
    None (and why) when capacity or use is not known."""
    if f.capacity is None:
        return None, "device memory not reported (give --device-memory)"
    if f.used is None:
        return None, "no memory figures reported"
    after = f.used + extra
    sign = "+" if extra >= 0 else "-"  # a change that saves memory reads "- 1.0MB", not "+ -1"
    return after <= t.fit_fraction * f.capacity, (
        f"peak use {nbytes(f.used)} {sign} {nbytes(abs(extra))} = {nbytes(after)} of "
        f"{nbytes(f.capacity)} ({f.capacity_text})"
    )


def lower_stage(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 1: the stage is higher than the model needs while its extra traffic is exposed."""
    c, p, step = f.config, f.params, f.step_s
    if c is None or p is None:
        return NotJudged("stage", "no config or parameter count reported (Hello)")
    if c.dp_world_size <= 1 or c.stage < 2 or c.offload_param != "none":
        return None
    if step is None or step <= 0:
        return NotJudged("stage", "no steady step timed yet")
    if c.stage == 3:
        ag = f.op("all_gather")
        share = ag.exposed / step
        if share < t.exposed_share_min or ag.seconds <= 0:
            return None
        # Stage 2 gathers the updated parameters after the step, fully exposed: Hockney's
        # t = alpha + S(N-1)/N / beta with alpha the median all-gather measured here and beta
        # the bus bandwidth of the step's largest collectives (facts.hockney).
        n = c.dp_world_size
        size = (p.padded_total or p.total) * param_bytes(c.precision)
        alpha, beta = hockney(f)
        if beta is None:
            return NotJudged(
                "stage", "no collective with a measurable bandwidth in the newest step"
            )
        # Stage 2 gathers bucket by bucket (DeepSpeed: allgather_bucket_size; this engine lays
        # its buckets out by reduce_bucket_size): the smaller bucket counts.
        bucket = max(1, min(c.reduce_bucket_size, c.allgather_bucket_size))
        gathers = max(1, math.ceil((p.padded_total or p.total) / bucket))
        after = gathers * alpha + size * (n - 1) / n / beta
        saves = ag.exposed - after
        wait = (
            f"exposed all-gather wait {ms(ag.exposed)} of a {ms(step)} step ({share:.0%}), "
            f"{ag.count:.0f} all-gathers per step ({f.steps_text})"
        )
        formula = (
            f"saves_ms = exposed all-gather wait - (buckets * alpha + Psi*p*(N-1)/N / beta) = "
            f"{ms(ag.exposed)} - ({gathers} * {ms(alpha)} + {nbytes(size)}*{n - 1}/{n} / "
            f"{beta / 1e9:.3g} GB/s) = {ms(saves)} (alpha: the median all-gather; beta: the "
            "busbw of the step's largest collectives)"
        )
        # Checked against the all-gather wait, the figure the formula prices: the total wait
        # also holds waits for peers that only move to another sync point (measured on 2 gloo
        # ranks of a shared 2-core host: all-gather wait 32.2 -> 4.4 ms, while the wait at the
        # post-backward reduce-scatter and the bf16 overflow all-reduce grew 0.1 -> 27 ms).
        metric = "fetch_wait_ms"
    else:
        g = c.gradient_accumulation_steps
        rs = f.op("reduce_scatter")
        share = rs.exposed / step
        if g < 2 or share < t.exposed_share_min:
            return None
        saves = rs.exposed * (g - 1) / g
        wait = (
            f"exposed reduce-scatter wait {ms(rs.exposed)} of a {ms(step)} step ({share:.0%}): "
            f"stage 2 reduces every one of the {g} micro-batches ({f.steps_text})"
        )
        formula = (
            f"saves_ms = exposed reduce-scatter wait * (g-1)/g = {ms(rs.exposed)} * "
            f"{g - 1}/{g} = {ms(saves)}"
        )
        metric = "exposed_ms"
    if saves <= 0:
        return None
    lower = c.stage - 1
    now, then = states_at(f, c.stage), states_at(f, lower)
    extra = then.device_total - now.device_total
    ok, fit_text = fits(f, extra - (f.gathered if c.stage == 3 else 0), t)
    if ok is None:
        return NotJudged("stage", f"lowering the stage would cut {ms(saves)}, but {fit_text}")
    if not ok:
        return None
    change: dict[str, object] = {"zero_optimization.stage": lower}
    if c.stage == 3 and c.overlap_comm:
        change["zero_optimization.overlap_comm"] = True  # its default is off below stage 3
    return Advice(
        rule="stage",
        title=f"lower ZeRO stage {c.stage} -> {lower}: the model fits, the traffic does not pay",
        evidence=(
            wait,
            f"P+G+O at stage {lower}: {nbytes(then.device_total)} per rank "
            f"(stage {c.stage}: measured {nbytes(f.model_states)}); {fit_text}",
        ),
        change=Change(change),
        formula=formula
        + f"; saves_bytes = -(P+G+O at stage {lower} - at stage {c.stage}) (ZeRO formulas) = "
        f"-{nbytes(extra)}",
        confidence="medium",
        saves_ms=saves * 1e3,
        saves_bytes=-extra,
        ms_metric=metric,
        bytes_metric="model_state_bytes",
    )


def activations(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 6: activations dominate the peak while memory is tight."""
    a, m, c = f.activations, f.model_states, f.config
    if not a or m is None or c is None:
        return None
    share = a / (a + m)
    if share < t.activations_share_min:
        return None
    if f.capacity is None or f.used is None:
        return NotJudged(
            "activations",
            f"activations are {share:.0%} of P+G+O+A but the device memory is not known "
            "(give --device-memory)",
        )
    if f.used < t.pressure * f.capacity:
        return None
    mb = max(1, c.micro_batch_size)
    headroom = max(f.headroom or 0, 0)
    per_sample = a / mb
    layers = f.latest_memory_field("activations_layers")
    inside = f.latest_memory_field("activations_in_layers")
    largest = f.latest_memory_field("activations_layer_max")
    inputs = f.latest_memory_field("activations_layer_inputs")
    forward = f.phase_s("forward")
    regather = f.op("all_gather").exposed / 2 if c.stage == 3 else 0.0
    cost = None if forward is None else forward + regather
    evidence = [
        f"activations {nbytes(a)} = {share:.0%} of P+G+O+A on the fullest rank "
        f"(P+G+O {nbytes(m)}); peak use {nbytes(f.used)} of {nbytes(f.capacity)} "
        f"({f.capacity_text}), {f.steps_text}",
        f"micro-batch ceiling now: {mb} + floor(headroom {nbytes(headroom)} / "
        f"{nbytes(per_sample)} per sample) = {mb + int(headroom // max(per_sample, 1))}",
    ]
    if layers < 2:
        return Advice(
            rule="activations",
            title="activations dominate the peak: checkpoint the model's blocks",
            evidence=(*evidence, "the split of activations by block was not reported"),
            change=Change(code="activation checkpointing of each repeated block"),
            formula="saves_bytes NA: needs the bytes saved inside each block (not reported)",
            confidence="low",
            saves_ms=None if cost is None else -cost * 1e3,
            ms_metric="step_ms",
        )
    after = a - inside + inputs + largest
    saves = a - after
    ceiling = mb + int((headroom + saves) // max(after / mb, 1))
    evidence.append(
        f"{layers} blocks saved {nbytes(inside)} inside (largest {nbytes(largest)}), their "
        f"inputs are {nbytes(inputs)}; with checkpointing the micro-batch ceiling is {ceiling}"
    )
    if cost is not None:
        evidence.append(f"forward {ms(forward)} per step (recomputed once in backward)")
    return Advice(
        rule="activations",
        title=f"activations dominate the peak: checkpoint the {layers} blocks",
        evidence=tuple(evidence),
        change=Change(
            code=f"activation checkpointing of each of the {layers} repeated blocks "
            "(deepspeed.checkpointing.checkpoint / torch.utils.checkpoint around each block; "
            "Hugging Face: model.gradient_checkpointing_enable())"
        ),
        formula=f"saves_bytes = A - (A - inside + inputs + largest block) = {nbytes(a)} - "
        f"({nbytes(a)} - {nbytes(inside)} + {nbytes(inputs)} + {nbytes(largest)}) = "
        f"{nbytes(saves)}; saves_ms = -(forward"
        + (" + half the exposed all-gather wait, re-gathered" if regather else "")
        + f") = -{ms(cost)}",
        confidence="high" if cost is not None else "medium",
        saves_bytes=saves,
        saves_ms=None if cost is None else -cost * 1e3,
        bytes_metric="activation_bytes",
        ms_metric="step_ms",
    )
