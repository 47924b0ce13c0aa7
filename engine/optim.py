"""Adam / AdamW applied to flat fp32 master shards.

One function, :func:`adam_step`, updates one flat fp32 tensor in place from its fp32 gradient.
It mirrors torch.optim.Adam/AdamW's single-tensor path op for op (decoupled decay
``p *= 1 - lr*wd`` for AdamW, ``g += wd*p`` for Adam; ``m.lerp_``; bias corrections
``1 - beta**t``), so a flat shard steps exactly like the per-parameter torch optimizer: every op
is elementwise, and flat or not changes nothing. Stages 0-2, stage 3 and CPU offload all call it.

``decoupled`` follows DeepSpeed: type "AdamW" always, type "Adam" unless
``adam_w_mode: false`` (DeepSpeed's ADAM_W_MODE_DEFAULT is True; runtime/engine.py
``_configure_basic_optimizer``), so a ported config with "Adam" + weight_decay keeps
DeepSpeed's (AdamW-style) behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(kw_only=True, slots=True)
class AdamHyper:
    """Hyperparameters of one parameter group (``lr`` is rewritten by the LR scheduler)."""

    lr: float
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = True


@dataclass(kw_only=True, slots=True)
class AdamState:
    """Adam moments of one flat fp32 shard: 8 bytes per element (part of O)."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    step: int = 0

    @classmethod
    def zeros_like(cls, master: torch.Tensor) -> AdamState:
        return cls(
            exp_avg=torch.zeros_like(master, dtype=torch.float32),
            exp_avg_sq=torch.zeros_like(master, dtype=torch.float32),
        )

    @classmethod
    def elsewhere(cls, device: torch.device) -> AdamState:
        """No moments here: they live in an offload store (engine/offload_store.py), which
        builds them on the host itself (never first on the device)."""
        return cls(
            exp_avg=torch.empty(0, dtype=torch.float32, device=device),
            exp_avg_sq=torch.empty(0, dtype=torch.float32, device=device),
        )

    @property
    def nbytes(self) -> int:
        return (self.exp_avg.numel() + self.exp_avg_sq.numel()) * 4


def adam_step(master: torch.Tensor, grad: torch.Tensor, state: AdamState, hp: AdamHyper) -> None:
    """One Adam(W) update of ``master`` (fp32, in place) from ``grad`` (fp32, unscaled)."""
    state.step += 1
    beta1, beta2 = hp.betas
    if hp.weight_decay != 0:
        if hp.decoupled:
            master.mul_(1 - hp.lr * hp.weight_decay)
        else:
            grad = grad.add(master, alpha=hp.weight_decay)
    state.exp_avg.lerp_(grad, 1 - beta1)
    state.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**state.step
    bias_correction2 = 1 - beta2**state.step
    step_size = hp.lr / bias_correction1
    denom = (state.exp_avg_sq.sqrt() / bias_correction2**0.5).add_(hp.eps)
    master.addcdiv_(state.exp_avg, denom, value=-step_size)


class ZeroOptimizer(torch.optim.Optimizer):
    """What ``initialize`` returns as the optimizer: the param groups and their
    hyperparameters (LR schedules, DeepSpeed's and torch's alike, rewrite ``lr`` here).

    It subclasses torch.optim.Optimizer only so torch's LR schedulers (and Hugging Face's
    LambdaLR ones) accept it; the update itself is the engine's (``engine.step()``), on flat
    fp32 master shards. ``Optimizer.__init__`` is deliberately not called: it imports
    torch._dynamo (~8 s on a CPU box) and would hold per-parameter state we never use."""

    def __init__(
        self, groups: list[dict[str, Any]], *, defaults: dict[str, Any], name: str, decoupled: bool
    ) -> None:
        self.defaults = dict(defaults)
        self.state: Any = {}
        self.param_groups = [{**self.defaults, **g} for g in groups]
        self._optimizer_step_pre_hooks: Any = {}
        self._optimizer_step_post_hooks: Any = {}
        self.name = name
        self.decoupled = decoupled
        self.overflow = False
        """Whether the last optimizer step was skipped for inf/NaN gradients (DeepSpeed's ZeRO
        optimizers carry it; accelerate reads it to skip the LR schedule's step)."""

    def hyper(self, group: int) -> AdamHyper:
        g = self.param_groups[group]
        return AdamHyper(
            lr=float(g["lr"]),
            betas=(float(g["betas"][0]), float(g["betas"][1])),
            eps=float(g["eps"]),
            weight_decay=float(g["weight_decay"]),
            decoupled=self.decoupled,
        )

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError("call engine.step(): the ZeRO engine applies the update")

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: the engine forgets gradients after every optimizer step."""
