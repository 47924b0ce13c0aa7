"""Rules about collectives: bucket sizes (2; 2b: ZeRO-3's held reduce bucket), stage-3 prefetch
(3) and overlap_comm (4).

Collective times follow Hockney's model t = alpha + S / beta, with alpha the median message time
of the op; beta is the op's best bus bandwidth for bucket sizes, the bus bandwidth of the step's
largest messages (facts.hockney) elsewhere.
"""

from __future__ import annotations

import math
import statistics

from zeroscope.agent.schema import Collective
from zeroscope.state.bandwidth import wire_bytes
from zeroscope.state.formulas import param_bytes
from zeroscope.state.rank import OpTotals, StepSummary

from .facts import Facts
from .model import Advice, Change, Finding, Thresholds, ms, nbytes

TINY = 64
"""Bytes at or under which a collective is a flag or a norm (overflow, grad norm), not data."""


def buckets(f: Facts, t: Thresholds) -> list[Finding]:
    """Rule 2: reductions (or stage 1-2 parameter gathers) split into many latency-bound
    collectives by a small bucket size.

    The saving is priced per steady step of the reference rank, against that same step's own
    length, and the median of those shares decides: one figure from one frame. (Priced from
    the newest step alone and compared with the cluster's mean step, a mean that one
    descheduled step drags up, the verdict on a run whose saving is a tenth of its step came
    and went with the machine's load.) Only what a bucket sets comes from the newest report:
    the messages' count, sizes, median time (alpha) and best rate (beta)."""
    c = f.config
    ref = f.reference
    if c is None or ref is None or c.dp_world_size <= 1:
        return []
    steady = [s for s in f.steady(ref) if s.duration_s > 0]
    if not steady:
        return []
    step = statistics.median(s.duration_s for s in steady)
    p = param_bytes(c.precision)
    out: list[Finding] = []
    ops = ["reduce_scatter", "all_reduce"] + (["all_gather"] if c.stage in (1, 2) else [])
    for op in ops:
        every = [x for x in f.collectives(op) if x.duration_s > 0]
        data = [x for x in every if x.nbytes > TINY]
        rows = [(s.ops.get(op), s.duration_s) for s in steady]
        waits = [o.exposed_s / d if o is not None else 0.0 for o, d in rows]
        if len(data) < 4 or statistics.median(waits) < t.op_share_min:
            continue
        # The link's rate is this op's best message (a slower one waited for a peer); the
        # median alpha below carries the typical wait once per collective. The step-wide
        # facts.hockney beta is not used here: it time-weights the largest messages, and a
        # stage 1-2 step's largest are the post-step gathers that wait for the peers'
        # optimizer (measured: 4 KB gathers of 3-14 ms beside 4 KB reduce-scatters of 0.06 ms),
        # which would price any bucket change as a loss.
        beta = max(wire_bytes(op, x.nbytes, x.group_size) / x.duration_s for x in data)
        elements = sum(x.nbytes for x in data) / p
        key = "allgather_bucket_size" if op == "all_gather" else "reduce_bucket_size"
        current = c.allgather_bucket_size if op == "all_gather" else c.reduce_bucket_size
        target = math.ceil(elements / 2)  # two buckets: one can overlap the other
        if target <= current:
            continue  # the count is not the bucket size's doing
        n, n_after = len(data), max(1, math.ceil(elements / target))
        alpha = statistics.median(x.duration_s for x in data)
        wire = sum(wire_bytes(op, x.nbytes, x.group_size) for x in data)
        after = n_after * alpha + wire / beta
        # The bucketed messages' share of the op's time (flags and norms stay as they are).
        movable = sum(x.duration_s for x in data) / sum(x.duration_s for x in every)
        priced = [_bucket_saving(o, movable, after) for o, _ in rows]
        saves = statistics.median(priced)
        share = statistics.median(v / d for v, (_, d) in zip(priced, rows, strict=True))
        if share < t.op_share_min:
            continue
        now = statistics.median(o.seconds * movable if o is not None else 0.0 for o, _ in rows)
        extra = (target - elements / n) * p * (2 if c.overlap_comm else 1)
        change = {f"zero_optimization.{key}": target}
        if op == "all_gather":
            change["zero_optimization.reduce_bucket_size"] = max(target, c.reduce_bucket_size)
        out.append(
            Advice(
                rule="buckets",
                title=f"{n} small {op.replace('_', '-')}s per step: larger buckets",
                evidence=(
                    f"{n} {op} of {nbytes(wire / n)} on the wire on average in step "
                    f"{f.latest.step if f.latest else '?'} of rank {ref.rank}; the median "
                    f"{ms(alpha)}, the best busbw {beta / 1e9:.3g} GB/s",
                    f"{op} took {ms(_median_of(rows, 'seconds'))} per step, waited "
                    f"{ms(_median_of(rows, 'exposed_s'))}, of a {ms(step)} step (medians, "
                    f"{f.steps_text}); "
                    f"{key} = {current:,} elements",
                ),
                change=Change(change),
                formula=f"saves_ms = median over steps of (now - (n' * alpha + bytes / beta)) "
                f"* exposed/total, now the step's {op} time = {ms(saves)}, "
                f"{share:.0%} of its step (median now {ms(now)}, n' = {n_after}, alpha "
                f"{ms(alpha)}, {nbytes(wire)} / {beta / 1e9:.3g} GB/s; Hockney: t = alpha + "
                f"S / beta); saves_bytes = -(new bucket - mean bucket) * {p} B"
                + (" * 2 (overlap_comm double-buffers)" if c.overlap_comm else "")
                + f" = -{nbytes(extra)}",
                confidence="medium",
                saves_ms=saves * 1e3,
                saves_bytes=-extra,
                ms_metric="exposed_ms",
                bytes_metric="device_peak_bytes",
            )
        )
    return out


def held_bucket(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 2b: ZeRO-3's reduce bucket, held for the whole run, larger than every gradient the
    model has. DeepSpeed fills it with the full gradients of one backward and flushes it when
    the next would overflow it or when the backward ends, so a bucket of the trainable element
    count is never flushed early either: the same reduce-scatters, for less memory. Its bytes
    come from the engine (``ConfigSummary.grad_bucket_bytes``, the Hello)."""
    c, p = f.config, f.params
    if c is None or p is None or c.stage != 3 or not c.grad_bucket_bytes:
        return None
    if "muon" in c.optimizer.lower():  # DeepSpeed's Muon also chunks its updates by the size
        return None
    need = min(p.trainable, p.total) or p.total
    if c.reduce_bucket_size <= need:
        return None
    held = c.grad_bucket_bytes
    saves = held * (1 - need / c.reduce_bucket_size)
    return Advice(
        rule="buckets",
        title=f"the reduce bucket holds {nbytes(held)} for {need:,} gradient elements: "
        "size it to the model",
        evidence=(
            f"ZeRO-3 holds its reduce bucket for the whole run: {nbytes(held)} per rank "
            f"(reduce_bucket_size = {c.reduce_bucket_size:,} elements)",
            f"the model's trainable gradients are {need:,} elements: one backward never fills "
            "a bucket that size, so it is flushed at the backward's end either way",
        ),
        change=Change({"zero_optimization.reduce_bucket_size": need}),
        formula=f"saves_bytes = held * (1 - trainable / reduce_bucket_size) = {nbytes(held)} * "
        f"(1 - {need:,} / {c.reduce_bucket_size:,}) = {nbytes(saves)}; the reduce-scatters "
        "stay the same",
        confidence="high",
        saves_bytes=saves,
        bytes_metric="device_peak_bytes",
    )


def _median_of(rows: list[tuple[OpTotals | None, float]], figure: str) -> float:
    """The median over steps of one of the op's per-step totals (0 in a step without it)."""
    return statistics.median(getattr(o, figure) if o is not None else 0.0 for o, _ in rows)


def _bucket_saving(totals: OpTotals | None, movable: float, after: float) -> float:
    """One step's saving from fewer buckets [s]: its bucketed messages' time less the time of
    ``after`` (the same bytes in the new buckets), the share the loop waited for."""
    if totals is None or totals.seconds <= 0:
        return 0.0
    hidden = min(totals.exposed_s / totals.seconds, 1.0)
    return max(totals.seconds * movable - after, 0.0) * hidden


def _unhideable(f: Facts, gathers: list[Collective], alpha: float) -> float:
    """Wait on the gathers no prefetch can hide: the step's first fetch and those issued in the
    optimizer phase (the persistent parameters' refresh), each at least a typical gather (the
    wait for peers at those sync points moves there, it does not go away)."""
    if not gathers:
        return 0.0
    latest = f.latest
    spans = [(s.start_s, s.start_s + s.duration_s) for s in (latest.phase_spans if latest else [])
             if s.name == "optimizer"]  # fmt: skip
    first = min(gathers, key=lambda x: x.start_s)
    late = [x for x in gathers if x is not first and any(a <= x.start_s <= b for a, b in spans)]
    return sum(max(x.exposed_s, alpha) for x in [first, *late])


def _gather_steps(f: Facts) -> list[tuple[StepSummary, OpTotals]]:
    """The reference rank's steady steps that issued all-gathers, with their totals."""
    ref = f.reference
    if ref is None:
        return []
    return [(s, o) for s in f.steady(ref) if (o := s.ops.get("all_gather")) is not None]


def _overlap(step: StepSummary, gathers: OpTotals, compute: float) -> float:
    """One step's forward + backward time less its wait in the gathers (its whole compute when
    it reported no phases)."""
    if step.forward_backward_s is None:
        return compute
    return max(step.forward_backward_s - gathers.exposed_s, 0.0)


def prefetch(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 3: stage-3 parameter fetches waited for (prefetch too small), or a prefetch window
    holding memory the step does not need (too large, low headroom)."""
    c, p = f.config, f.params
    if c is None or p is None or c.stage != 3 or c.dp_world_size <= 1 or f.step_s is None:
        return None
    ag = f.op("all_gather")
    compute = f.compute_s
    if ag.count == 0 or not compute:
        return None
    ratio = ag.exposed / compute
    # Prefetch hides fetches behind forward and backward compute only: each steady step's own
    # (its forward + backward less its own wait in the gathers), never one step's phases set
    # against another frame's wait (a quick newest step then read as no compute at all).
    steps = _gather_steps(f)
    overlaps = [_overlap(s, o, compute) for s, o in steps]
    overlap = statistics.median(overlaps) if overlaps else compute
    gathers = f.collectives("all_gather")
    size = param_bytes(c.precision)
    nonpersistent = max((p.padded_total or p.total) - p.persistent, 0)
    largest = max(p.largest_layer, 1)
    evidence = (
        f"waiting in parameter fetch {ms(ag.exposed)} per step vs compute {ms(compute)} "
        f"(ratio {ratio:.2f}); {ag.count:.0f} fetches per step, "
        f"{sum(x.prefetched for x in gathers)} of {len(gathers)} prefetched in step "
        f"{f.latest.step if f.latest else '?'} ({f.steps_text})",
        f"stage3_prefetch_bucket_size = {c.prefetch_bucket_size:,} elements; largest layer "
        f"{largest:,}, gathered parameters {nonpersistent:,}; gathered peak {nbytes(f.gathered)}",
    )
    if ratio > t.prefetch_wait_max:
        # A window of k layers ahead, k covering one gather's time with the compute between
        # two fetches; its first gather (k layers at once) is waited for.
        alpha = statistics.median(x.duration_s for x in gathers) if gathers else 0.0
        per_fetch = overlap / max(ag.count, 1.0)
        k = max(2, math.ceil(alpha / per_fetch) + 1) if per_fetch > 0 else 2
        new = min(max(k * largest, 2 * largest), max(nonpersistent, 2 * largest))
        if new <= c.prefetch_bucket_size:
            return None  # already covers the gathers: the wait is bandwidth, not prefetch
        unhideable = _unhideable(f, gathers, alpha)
        hideable = max(ag.exposed - unhideable - k * alpha, 0.0)
        busy = ag.seconds
        # Priced per steady step with that step's own wait, fetch time and compute; the median
        # saving is the figure (the formula below shows the median step's terms).
        priced = [
            max(0.0, max(o.exposed_s - unhideable - k * alpha, 0.0) - max(o.seconds - lap, 0.0))
            for (_, o), lap in zip(steps, overlaps, strict=True)
        ]
        saves = statistics.median(priced) if priced else 0.0
        after = min(nonpersistent * size, f.gathered + (new - c.prefetch_bucket_size) * size)
        extra = max(after - f.gathered, 0)
        change: dict[str, object] = {"zero_optimization.stage3_prefetch_bucket_size": new}
        if c.max_live_parameters < new:
            change["zero_optimization.stage3_max_live_parameters"] = new
        return Advice(
            rule="prefetch",
            title="stage-3 prefetch too small: fetches are waited for",
            evidence=evidence,
            change=Change(change),
            formula=f"saves_ms = median over steady steps of (hideable wait - max(0, fetch time - "
            f"forward/backward compute)) = {ms(saves)} (medians {ms(hideable)} - max(0, "
            f"{ms(busy)} - {ms(overlap)}); hideable: all but "
            f"the step's first fetch, the post-step refresh and the window's first gather of "
            f"{k} layers, at least the median gather {ms(alpha)} each; assumes the gathers progress "
            f"while the loop computes); saves_bytes = -(min(gathered params, "
            f"gathered peak + (new - old) bucket) * {size} B - gathered peak) = -{nbytes(extra)}",
            # Hiding needs the gathers to progress while the loop computes: NCCL on a GPU does;
            # gloo on a CPU only with a core to spare per rank (on an oversubscribed host the
            # prefetched gathers starve and the step can get slower).
            confidence="medium" if f.state.device.startswith("cuda") else "low",
            saves_ms=saves * 1e3,
            saves_bytes=-extra,
            ms_metric="fetch_wait_ms",
            bytes_metric="gathered_bytes",
        )
    headroom, cap = f.headroom, f.capacity
    floor = 2 * largest * size
    if ratio < t.prefetch_wait_min and headroom is not None and cap and f.gathered > floor:
        if headroom > (1 - t.pressure) * cap:
            return None
        hidden = max(ag.seconds - ag.exposed, 0.0)
        return Advice(
            rule="prefetch",
            title="stage-3 prefetch larger than it needs while memory is tight",
            evidence=(*evidence, f"headroom {nbytes(headroom)} of {nbytes(cap)}"),
            change=Change(
                {
                    "zero_optimization.stage3_prefetch_bucket_size": 2 * largest,
                    "zero_optimization.stage3_max_live_parameters": 2 * largest,
                }
            ),
            formula=f"saves_bytes = gathered peak - 2 * largest layer * {size} B = "
            f"{nbytes(f.gathered)} - {nbytes(floor)}; saves_ms >= -(fetch time now hidden) = "
            f"-{ms(hidden)} (at worst every fetch is waited for)",
            confidence="low",
            saves_bytes=f.gathered - floor,
            saves_ms=-hidden * 1e3,
            bytes_metric="gathered_bytes",
            ms_metric="fetch_wait_ms",
        )
    return None


def overlap(f: Facts, t: Thresholds) -> Finding | None:
    """Rule 4: overlap_comm off while gradient reductions are waited for (or on, hiding
    nothing, while memory is tight)."""
    c, step = f.config, f.step_s
    if c is None or step is None or step <= 0 or c.dp_world_size <= 1:
        return None
    reds = [x for x in f.collectives("reduce_scatter") + f.collectives("all_reduce")
            if x.nbytes > TINY]  # fmt: skip
    if not reds:
        return None
    waited = sum(x.exposed_s for x in reds)
    total = sum(x.duration_s for x in reds)
    size = max(x.nbytes for x in reds)
    backward = f.phase_s("backward")
    g = max(1, c.gradient_accumulation_steps)
    per_micro = max(1, len(reds) // g if c.stage >= 2 else len(reds))
    where = f"step {f.latest.step if f.latest else '?'} of rank {f.reference.rank if f.reference else '?'}"
    if not c.overlap_comm and waited / step >= t.op_share_min and backward:
        compute = max(backward - waited, 0.0)
        saves = min(waited * (per_micro - 1) / per_micro, compute)
        if saves <= 0:
            return None
        return Advice(
            rule="overlap",
            title="overlap_comm off: gradient reductions wait after backward",
            evidence=(
                f"{len(reds)} gradient reductions waited {ms(waited)} of a {ms(step)} step in "
                f"{where}; backward {ms(backward)}, {per_micro} bucket(s) per backward",
            ),
            change=Change({"zero_optimization.overlap_comm": True}),
            formula=f"saves_ms = min(wait * (buckets-1)/buckets, backward compute) = min("
            f"{ms(waited)} * {per_micro - 1}/{per_micro}, {ms(compute)}) = {ms(saves)} (the last "
            f"bucket cannot overlap); saves_bytes = -one more bucket in flight = -{nbytes(size)}",
            confidence="medium",
            saves_ms=saves * 1e3,
            saves_bytes=-float(size),
            ms_metric="exposed_ms",
            bytes_metric="device_peak_bytes",
        )
    hidden = total - waited
    cap, used = f.capacity, f.used
    if c.overlap_comm and c.stage < 3 and total > 0 and hidden / total < 0.1 and cap and used:
        if used < t.pressure * cap:
            return None
        return Advice(
            rule="overlap",
            title="overlap_comm hides almost nothing while memory is tight",
            evidence=(
                f"gradient reductions took {ms(total)}, {ms(hidden)} of it hidden ({where}); "
                f"peak use {nbytes(used)} of {nbytes(cap)}",
            ),
            change=Change({"zero_optimization.overlap_comm": False}),
            formula=f"saves_bytes = the second bucket = {nbytes(size)}; saves_ms = -hidden = "
            f"-{ms(hidden)}",
            confidence="medium",
            saves_ms=-hidden * 1e3,
            saves_bytes=float(size),
            ms_metric="exposed_ms",
            bytes_metric="device_peak_bytes",
        )
    return None
