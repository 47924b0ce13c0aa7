"""The ZeRO memory and communication formulas: what a config *should* cost, per rank.

One module serves ``zeroscope estimate``, the Memory and Communication screens and the engine's
tests, so the prediction users read is the one the tests hold the engine to. Pure Python: no
torch, no Textual.

Memory follows the ZeRO paper (Rajbhandari et al., arXiv 1910.02054, section 5 and figure 1):
mixed-precision Adam keeps 2 bytes of 16-bit parameters (P), 2 of 16-bit gradients (G) and
K = 12 of fp32 master weights + Adam m, v (O) per parameter; stage 1 shards O, stage 2 also G,
stage 3 also P over the N data-parallel ranks. Offload moves the optimizer's part (and with it
the gradient shard it consumes) or the parameter shard to host memory, as ZeRO-Offload and
DeepSpeed's estimators do (runtime/zero/stage_1_and_2.py, stage3.py
``estimate_zero*_model_states_mem_needs``).

Communication follows section 7 of the same paper: stages 0-2 move 2Ψ elements per step
(reduce-scatter + all-gather, the same as an all-reduce), stage 3 moves 3Ψ (all-gather in
forward, again in backward, reduce-scatter of gradients).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Precision = Literal["fp32", "bf16", "fp16"]
Offload = Literal["none", "cpu", "nvme"]

GB = 1e9
"""The paper's gigabyte (decimal): 7.5e9 parameters x 16 bytes = 120 GB."""


def param_bytes(precision: str) -> int:
    """Bytes per element of the parameters and gradients the model computes with."""
    if precision in ("fp16", "bf16"):
        return 2
    if precision == "fp32":
        return 4
    raise ValueError(f"precision must be fp32, bf16 or fp16, not {precision!r}")


def optimizer_bytes(precision: str) -> int:
    """K: optimizer-state bytes per parameter for Adam. Mixed precision keeps an fp32 master
    copy beside fp32 m and v (12); an fp32 run's parameters already are the master (8)."""
    return 8 if param_bytes(precision) == 4 else 12


@dataclass(frozen=True, slots=True)
class ModelStateBytes:
    """Predicted model-state bytes held by one data-parallel rank, by part and place."""

    params: float
    grads: float
    optim: float
    host_params: float = 0.0
    host_grads: float = 0.0
    host_optim: float = 0.0

    @property
    def device_total(self) -> float:
        return self.params + self.grads + self.optim

    @property
    def host_total(self) -> float:
        return self.host_params + self.host_grads + self.host_optim

    @property
    def total(self) -> float:
        return self.device_total + self.host_total


def _check(psi: float, ranks: int, stage: int, offload_optimizer: str, offload_param: str) -> None:
    if psi < 0:
        raise ValueError(f"the parameter count must be >= 0, not {psi}")
    if ranks < 1:
        raise ValueError(f"the data-parallel world size must be >= 1, not {ranks}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage}")
    for name, value in (("offload_optimizer", offload_optimizer), ("offload_param", offload_param)):
        if value not in ("none", "cpu", "nvme"):
            raise ValueError(f"{name} must be none, cpu or nvme, not {value!r}")
    if offload_optimizer != "none" and stage == 0:
        raise ValueError("offload_optimizer needs ZeRO stage 1, 2 or 3")
    if offload_param != "none" and stage != 3:
        raise ValueError("offload_param needs ZeRO stage 3")


def model_state_bytes(
    psi: float,
    ranks: int,
    stage: int,
    precision: str = "fp16",
    offload_optimizer: str = "none",
    offload_param: str = "none",
    persistent: float = 0.0,
    trainable: float | None = None,
) -> ModelStateBytes:
    """Bytes of P, G and O one rank holds for a model of ``psi`` parameters (paper, figure 1).

    With ``offload_optimizer`` the O shard lives on the host, and so does the gradient shard
    the host optimizer consumes, in fp32 as DeepSpeed's CPU Adam takes it (4Ψ/N; device G is
    then only the transient reduce bucket, not model state). With ``offload_param`` (stage 3)
    the P shard lives on the host too. ``persistent`` (stage 3): elements at or under
    stage3_param_persistence_threshold, which every rank also holds whole, beside their shard
    (as DeepSpeed keeps ``ds_tensor`` for persistent parameters too; G and O stay sharded).

    ``trainable`` (default: all ``psi``): the parameters the optimizer steps. Frozen ones
    (``psi - trainable``: a LoRA fine-tune's base model) are held like the others, so P counts
    all ``psi`` (whole at stages 0-2, where DeepSpeed keeps them outside its flat groups on
    every rank; sharded at stage 3), while G and O follow the trainable ones only.
    """
    _check(psi, ranks, stage, offload_optimizer, offload_param)
    t = psi if trainable is None else trainable
    if not 0 <= t <= psi:
        raise ValueError(f"the trainable count must be between 0 and {psi:g}, not {t:g}")
    p, k = param_bytes(precision), optimizer_bytes(precision)
    params = p * (psi / ranks + persistent) if stage >= 3 else p * psi
    grads = p * t / ranks if stage >= 2 else p * t
    optim = k * t / ranks if stage >= 1 else k * t
    host_params = host_grads = host_optim = 0.0
    if offload_optimizer != "none":
        # The host keeps its own fp32 master beside m and v (12 bytes), even in an fp32 run,
        # where without offload the parameters themselves are the master (8).
        host_optim, optim = 12 * t / ranks, 0.0
        host_grads = 4 * t / ranks
        grads = 0.0 if stage >= 2 else grads
    if offload_param != "none":
        # The shards go to the host; the persistent parameters stay whole on the device (as
        # DeepSpeed keeps them: only their ds_tensor shard is offloaded with the others).
        host_params, params = p * psi / ranks, p * persistent
    return ModelStateBytes(
        params=params,
        grads=grads,
        optim=optim,
        host_params=host_params,
        host_grads=host_grads,
        host_optim=host_optim,
    )


def comm_elements_per_step(psi: float, stage: int, trainable: float | None = None) -> float:
    """Elements moved per optimizer step in the nccl-tests message-size convention (paper,
    section 7): 2Ψ for stages 0-2 (reduce-scatter + all-gather, i.e. one all-reduce), 3Ψ for
    stage 3 (an extra parameter all-gather in backward). Each rank sends (N-1)/N of it.
    Frozen parameters (``psi - trainable``) have no gradient to reduce and, at stages 0-2,
    nothing to gather back; stage 3 still gathers them in forward and backward."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage}")
    t = psi if trainable is None else trainable
    return 2 * psi + t if stage == 3 else 2 * t


def comm_bytes_per_step(
    psi: float, stage: int, precision: str = "fp16", trainable: float | None = None
) -> float:
    """:func:`comm_elements_per_step` in bytes of the 16-bit (or fp32) model dtype."""
    return comm_elements_per_step(psi, stage, trainable) * param_bytes(precision)
