"""Rules about where the model lives: offload (7), ``zero.Init`` at start-up (9) and stage-3
16-bit saves without gathering (10)."""

from __future__ import annotations

from .facts import Facts
from .model import Advice, Change, Finding, NotJudged, Thresholds, ms, nbytes
from .rules_memory import fits, states_at


def offload(f: Facts, t: Thresholds) -> list[Finding]:
    """Rule 7: offload that is slower than it needs to be, or not needed at all."""
    c, p = f.config, f.params
    if c is None or p is None or (c.offload_optimizer == "none" and c.offload_param == "none"):
        return []
    ref = f.reference
    if ref is None or f.step_s is None:
        return [NotJudged("offload", "no steady step reported yet")]
    steps = f.steady(ref)
    moved = sum(s.offload_bytes for s in steps) / len(steps)
    spent = sum(s.offload_s for s in steps) / len(steps)
    optimizer = f.phase_s("optimizer")
    out: list[Finding] = []
    bw = moved / spent if spent > 0 else None
    seen = (
        f"offload copies {nbytes(moved)} in {ms(spent)} per step"
        + (f" ({bw / 1e9:.3g} GB/s)" if bw else "")
        + (f", optimizer phase {ms(optimizer)}" if optimizer is not None else "")
        + f", step {ms(f.step_s)} ({f.steps_text})"
    )
    on_gpu = f.state.device.startswith("cuda")
    if on_gpu and not c.offload_pin_memory and spent > 0:
        out.append(
            Advice(
                rule="offload_pin",
                title="pin the offload buffers (pageable copies are staged and synchronous)",
                evidence=(seen, "offload_optimizer.pin_memory is false"),
                change=Change({"zero_optimization.offload_optimizer.pin_memory": True}),
                formula="saves_ms <= the measured copy time "
                f"{ms(spent)}: NA exactly (no pinned-bandwidth reference measured here)",
                confidence="low",
                ms_metric="offload_ms",
            )
        )
    now = states_at(f, c.stage)
    then = states_at(f, c.stage, offload="none")
    extra = then.device_total - now.device_total
    ok, fit_text = fits(f, extra, t)
    if ok is None:
        out.append(NotJudged("offload", f"whether dropping offload fits: {fit_text}"))
    elif ok and spent > 0:
        change = {"zero_optimization.offload_optimizer.device": "none"}
        if c.offload_param != "none":
            change["zero_optimization.offload_param.device"] = "none"
        out.append(
            Advice(
                rule="offload",
                title="drop offload: the device has room for the optimizer state",
                evidence=(seen, f"P+G+O without offload: {nbytes(then.device_total)}; {fit_text}"),
                change=Change(dict(change)),
                formula=f"saves_ms >= the offload copies' time {ms(spent)} (the host optimizer "
                f"step's own cost comes on top); saves_bytes = -(P+G+O without offload - with) "
                f"= -{nbytes(extra)} on the device ({nbytes(now.host_total)} freed on the host)",
                confidence="medium",
                saves_ms=spent * 1e3,
                saves_bytes=-extra,
                ms_metric="offload_ms",
                bytes_metric="model_state_bytes",
            )
        )
    return out


def zero_init(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 9: stage 3 without ``zero.Init``: every rank built the whole model first."""
    c, p = f.config, f.params
    if c is None or p is None or c.stage != 3 or c.dp_world_size <= 1:
        return None
    if p.zero_init is None or not p.built_bytes:
        return NotJudged("zero_init", "the engine did not say how the model was built")
    if p.zero_init:
        return None
    rss = [
        r.hello.init_rss_peak_bytes
        for r in f.state.ranks.values()
        if r.hello is not None and r.hello.init_rss_peak_bytes
    ]
    peak = max(rss) if rss else None
    n = c.dp_world_size
    saves = p.built_bytes * (n - 1) / n
    if peak is not None and p.built_bytes < 0.1 * peak:
        return None  # the model is a small part of what start-up held: not worth a change
    return Advice(
        rule="zero_init",
        title="build the model under zero.Init: every rank now holds all of it at start-up",
        evidence=(
            f"each of the {n} ranks built all {nbytes(p.built_bytes)} of parameters before "
            "the engine partitioned them (no zero.Init)",
            "start-up peak resident memory "
            + (f"{nbytes(peak)} per rank (Hello)" if peak else "NA (not reported)"),
        ),
        change=Change(
            code="construct the model inside deepspeed.zero.Init(config_dict_or_path=ds_config) "
            "(Hugging Face: create HfDeepSpeedConfig(ds_config) before from_pretrained)"
        ),
        formula=f"saves_bytes (at start-up, host or device where the model is built) = "
        f"built * (N-1)/N = {nbytes(p.built_bytes)} * {n - 1}/{n} = {nbytes(saves)}",
        confidence="high",
        saves_bytes=saves,
    )


def save_gather(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 10: a stage-3 save that cannot hold full weights."""
    c, p = f.config, f.params
    if c is None or p is None or c.stage != 3 or c.gather_16bit_weights_on_model_save:
        return None
    saves = [e for e in f.state.events if e.event == "checkpoint" and "load" not in e.message]
    if not saves:
        return None
    skipped = [e for e in saves if "skipped" in e.message]
    first = (skipped or saves)[0]
    n = c.dp_world_size
    full = p.total * 2
    return Advice(
        rule="save_gather",
        title="stage-3 saves hold 1/N of each weight: gather the 16-bit weights on save",
        evidence=(
            f"step {first.step}, rank {first.rank}: {first.message}",
            f"stage3_gather_16bit_weights_on_model_save is false: each of the {n} ranks holds "
            f"{nbytes(full / n)} of the {nbytes(full)} of 16-bit weights",
        ),
        change=Change({"zero_optimization.stage3_gather_16bit_weights_on_model_save": True}),
        formula=f"saves_bytes = -largest layer * 2 = -{nbytes(p.largest_layer * 2)} transient "
        "per rank while saving (weights gathered a layer at a time, rank 0 writes "
        f"{nbytes(full)}); or consolidate offline with zero_to_fp32.py",
        confidence="high",
        severity="error" if skipped else "advice",
        saves_bytes=-(p.largest_layer * 2),
    )
