"""What the job's config *should* cost per rank: model-state memory and communication volume per
optimizer step, beside which the Memory and Comm screens set what was measured.

Memory is the ZeRO paper's accounting (zeroscope.state.formulas.model_state_bytes), with Ψ split
into trainable and frozen parameters (P holds all, G and O only the trainable), and what the
engine says in its Hello about its own layout where it departs from the paper (DeepSpeed: the
reduce bucket ZeRO-3 holds, its host gradient buffer under CPU offload, each ZeRO-1/2 rank's
whole edge gradients, ZeRO-1's device gradients freed under offload). Communication is
the engine's real traffic model, not only the paper's 2Ψ / 3Ψ: with Ψ elements (padded as the
engine pads them, ``ParamCounts.padded_total``), p bytes per element, g micro-batches per step
(gradient accumulation), volumes in the bandwidth.volume convention (all-reduce counts 2S):

- stage 0: one gradient all-reduce at the boundary                        2Ψp
- stage 1: reduce-scatter at the boundary + all-gather of the parameters  2Ψp
- stage 2: a reduce-scatter every micro-batch + the all-gather            (g + 1)Ψp
- stage 3: every micro-batch gathers the non-persistent parameters Ψn in forward and again in
  backward, minus what stage3_max_reuse_distance / max_live_parameters keep gathered between
  the two (a fraction k), then reduce-scatters all gradients; after the step the persistent
  parameters Ψp_ are refreshed by one all-gather:                         g(Ψn(2 - k) + Ψ)p + Ψp_·p

k: a parameter is kept when its next use (in backward) is within max_reuse_distance elements,
about twice the elements after it in forward, so the last min(distance / 2, max_live) elements
of forward are kept: k = min(1, distance / 2 / Ψn, max_live / Ψn). The few-byte all-reduces
(global gradient norm, fp16 overflow flag) are left out (under 0.01 % of any real model).
These are steady-step figures: step 1 also carries the initial broadcasts and stage 3's
recording step (no reuse yet).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from zeroscope.state.formulas import (
    ModelStateBytes,
    comm_bytes_per_step,
    model_state_bytes,
    param_bytes,
)

from . import units

if TYPE_CHECKING:
    from zeroscope.agent.schema import ConfigSummary, ParamCounts

    from .cluster import ClusterState


def predicted_memory(state: ClusterState) -> tuple[ModelStateBytes | None, str]:
    """The formula's bytes per rank for the job's config, and the line that says which."""
    c, p = state.config, state.params
    if c is None or p is None:
        return None, "prediction NA: no config or parameter count reported yet"
    try:
        held = c.held_precision or c.precision  # what is kept between steps (FSDP2's MP)
        t = min(p.trainable, p.total)  # the parameters G and O follow
        m = model_state_bytes(
            p.total,
            c.dp_world_size,
            c.stage,
            held,
            c.offload_optimizer,
            c.offload_param,
            persistent=p.persistent,
            trainable=t,
        )
    except ValueError as exc:
        return None, f"prediction NA: {exc}"
    buckets = "" if held == c.precision else f", held in {held} (computed in {c.precision})"
    if c.no_master_copy:  # the optimizer's state beside the held parameters, no master
        slots = c.optimizer_slots if c.optimizer_slots >= 0 else 2  # else Adam's m and v
        elements = c.optimizer_state_elements or slots * t  # several optimizers: their sum
        o = elements * param_bytes(held) / (c.dp_world_size if c.stage >= 1 else 1)
        m = replace(m, optim=o if m.optim else 0.0, host_optim=o if m.host_optim else 0.0)
        known = c.optimizer_slots >= 0 or c.optimizer_state_elements > 0
        named = f"{c.optimizer} " if known else ""
        buckets += f", O {named}without a master copy"
    if c.params_sharded_at_step and c.stage == 2 and m.params:
        m = replace(m, params=m.params / c.dp_world_size)
        buckets += ", P sharded at the step (resharded after backward)"
    if c.grad_buckets_separate:  # the reducer's buckets: one more copy of every trainable grad
        m = replace(m, grads=2 * m.grads)
        buckets += ", gradients and their reduce buckets"
    if c.fp32_master_copy and c.precision == "fp32" and c.stage >= 1 and m.optim:
        # the optimizer's own fp32 copy of the partition beside Adam's moments: 12 bytes, not 8
        trainable = min(p.trainable, p.total) or p.total
        m = replace(m, optim=m.optim + 4 * trainable / c.dp_world_size)
        buckets += ", O with the optimizer's fp32 copy of the partition"
    if c.grad_bucket_bytes:  # held for the whole run, whatever the model's size
        m = replace(m, grads=m.grads + c.grad_bucket_bytes)
        buckets += (
            f", G with the engine's reduce bucket {units.size(c.grad_bucket_bytes)}"
            f" (reduce_bucket_size {c.reduce_bucket_size:,})"
        )
    if c.host_grad_copy_bytes and m.host_grads:  # the engine's own host gradient buffer
        m = replace(m, host_grads=m.host_grads + c.host_grad_copy_bytes * t / c.dp_world_size)
        buckets += (
            f", host G with the engine's {c.host_grad_copy_bytes}-byte gradient buffer beside"
            " the fp32 one"
        )
    if c.grad_accum_bytes and m.grads:  # whole accumulation buffers beside the gradients
        m = replace(m, grads=m.grads + c.grad_accum_bytes * float(p.padded_total or p.total))
        buckets += f", G with the engine's {c.grad_accum_bytes}-byte gradient accumulation buffers"
    if c.grads_freed_under_offload and c.stage == 1 and c.offload_optimizer != "none":
        m = replace(m, grads=0.0)
        buckets += ", no device G at the step (the engine frees it under offload)"
    if c.grad_elements_held and c.stage in (1, 2):
        buckets += ", G per rank: the whole gradients of the parameters its partition overlaps"
    trainable = f" ({p.trainable:,} trainable)" if p.frozen else ""
    return m, (
        f"ZeRO-{c.stage} {c.precision}, Ψ={p.total:,} parameters{trainable}, "
        f"N={c.dp_world_size}, offload optimizer {c.offload_optimizer}, param {c.offload_param}"
        f"{buckets}"
    )


def rank_grads(state: ClusterState, rank: int, m: ModelStateBytes) -> float:
    """Device G predicted for ``rank``: the job's figure, or where the engine's layout says
    what each rank keeps (DeepSpeed ZeRO-1/2: ``ConfigSummary.grad_elements_held`` in its
    Hello), those elements in the model's dtype, the engine's held buckets beside them."""
    rs = state.ranks.get(rank)
    c = rs.hello.config if rs is not None and rs.hello is not None else None
    if c is None or not c.grad_elements_held or c.stage not in (1, 2):
        return m.grads
    return param_bytes(c.precision) * c.grad_elements_held + c.grad_bucket_bytes


@dataclass(frozen=True, slots=True)
class TrafficPrediction:
    volume: float
    """Communication volume per rank per steady optimizer step [bytes]."""
    paper: float
    """The paper's 2Ψ / 3Ψ for the same model [bytes], for reference."""
    label: str
    """How the volume is made up, e.g. "2 reduce-scatters + all-gather"."""

    def ratio(self, measured: float | None) -> float | None:
        """Measured / predicted volume [ratio]; NA without both."""
        return measured / self.volume if measured is not None and self.volume else None

    def paper_ratio(self, measured: float | None) -> float | None:
        """Measured / the paper's volume [ratio]; NA without both."""
        return measured / self.paper if measured is not None and self.paper else None


def deviation(measured: float | None, predicted: float | None) -> float | None:
    """Measured / predicted - 1 [fraction] (the Memory screen's +x%); NA when either is
    missing or the prediction is 0."""
    if measured is None or not predicted:
        return None
    return measured / predicted - 1


def reuse_fraction(config: ConfigSummary, nonpersistent: float) -> float:
    """k of the module docstring: the share of forward's gathered elements kept for backward."""
    if nonpersistent <= 0:
        return 1.0
    kept = min(config.max_reuse_distance / 2, config.max_live_parameters)
    return max(0.0, min(1.0, kept / nonpersistent))


def traffic_elements(config: ConfigSummary, params: ParamCounts) -> tuple[float, str]:
    """Elements moved per steady step (volume convention) and the label saying how."""
    psi = float(params.padded_total or params.total)
    g = max(1, config.gradient_accumulation_steps)
    if config.dp_world_size <= 1:
        return 0.0, "no data parallelism: no gradient traffic"
    if config.stage == 0:  # frozen parameters have no gradient to all-reduce (DDP, LoRA)
        trainable = float(min(params.trainable, params.total))
        return 2 * trainable, "gradient all-reduce"
    # DeepSpeed's ZeRO-1/2 all-reduce the whole flat gradients (2Ψ each), the bundled engine
    # reduce-scatters them (Ψ); stage 2 reduces every micro-batch, stage 1 once a step.
    reduce, op = (2, "all-reduce") if config.grads_all_reduced else (1, "reduce-scatter")
    if config.stage == 1:
        return (reduce + 1) * psi, f"gradient {op} + all-gather"
    if config.stage == 2:
        return (g * reduce + 1) * psi, f"{g} gradient {op}{'s' if g > 1 else ''} + all-gather"
    persistent = float(params.persistent)
    nonpersistent = max(psi - persistent, 0.0)
    k = reuse_fraction(config, nonpersistent)
    # Frozen parameters are gathered like the others but have no gradient to reduce-scatter.
    per_micro = nonpersistent * (2 - k) + max(psi - params.frozen, 0.0)
    label = f"{g}x(gathers {2 - k:.2f}Ψn + reduce-scatter Ψ) + persistent refresh"
    return g * per_micro + persistent, label


def predicted_traffic(state: ClusterState) -> TrafficPrediction | None:
    """The volume the engine should move per steady step for the job's config; NA without a
    config and parameter count."""
    c, p = state.config, state.params
    if c is None or p is None:
        return None
    try:
        elements, label = traffic_elements(c, p)
        size = param_bytes(c.precision)
        paper = (  # the paper's 2Ψ / 3Ψ is data-parallel traffic: none without replicas
            comm_bytes_per_step(p.total, c.stage, c.precision, min(p.trainable, p.total))
            if c.dp_world_size > 1
            else 0.0
        )
    except ValueError:
        return None
    return TrafficPrediction(volume=elements * size, paper=paper, label=label)


def paper_differences(config: ConfigSummary, params: ParamCounts) -> list[str]:
    """Why the engine's traffic differs from the paper's 2Ψ / 3Ψ for this config, one short
    reason each (the Comm screen prints them beside the two ratios)."""
    out = []
    g = max(1, config.gradient_accumulation_steps)
    if config.stage in (2, 3) and g > 1:
        out.append(f"gradients are reduce-scattered every micro-batch ({g} per step)")
    if config.stage == 3:
        psi = float(params.padded_total or params.total)
        nonpersistent = max(psi - float(params.persistent), 0.0)
        k = reuse_fraction(config, nonpersistent)
        if k > 0:
            out.append(f"backward reuses {k:.0%} of forward's gathers (stage3_max_reuse_distance)")
        if params.persistent:
            out.append("persistent parameters are gathered once per step, not per micro-batch")
    if (params.padded_total or params.total) != params.total:
        out.append("the engine pads the flat buffers it communicates")
    return out
