"""Adam / AdamW applied to flat fp32 master shards.

One function, :func:`adam_step`, updates one flat fp32 tensor in place from its fp32 gradient.
It mirrors torch.optim.Adam/AdamW's single-tensor path op for op (decoupled decay
``p *= 1 - lr*wd`` for AdamW, ``g += wd*p`` for Adam; ``m.lerp_``; bias corrections
``1 - beta**t``), so a flat shard steps exactly like the per-parameter torch optimizer: every op
is elementwise, and flat or not changes nothing. Stages 0-2, stage 3 and CPU offload all call it.

Any other torch optimizer (a client ``torch.optim.SGD`` / ``Adagrad`` ..., or a ds_config type
torch has) runs as DeepSpeed runs it: the optimizer's own ``step`` on the flat fp32 master
shards, one param group per shard (:class:`ShardOptimizer`). Elementwise optimizers (SGD with
momentum, Adagrad, RMSprop, ...) step a flat shard exactly as they step the parameters.

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


class ShardOptimizer:
    """A torch optimizer class run on the flat fp32 master shards (DeepSpeed puts its fp32
    partitions into the client optimizer's param groups and calls its ``step``). Built at the
    first step; before each step every shard's group takes the hyperparameters of its param
    group in :class:`ZeroOptimizer` (where LR schedules write)."""

    def __init__(self, cls: type[torch.optim.Optimizer]) -> None:
        self.cls = cls
        self.inner: torch.optim.Optimizer | None = None
        self._pending: list[dict[str, Any]] | None = None

    def step(
        self, masters: list[torch.Tensor], grads: list[torch.Tensor], groups: list[dict[str, Any]]
    ) -> None:
        hyper = [{k: v for k, v in g.items() if k not in ("params", "initial_lr")} for g in groups]
        if self.inner is None:
            groups = [{"params": [m], **h} for m, h in zip(masters, hyper)]
            self.inner = self.cls(groups)  # type: ignore[call-arg]
            if self._pending is not None:
                self.load(self._pending)
        for group, h in zip(self.inner.param_groups, hyper):
            group.update(h)
        for m, g in zip(masters, grads):
            m.grad = g
        self.inner.step()
        for m in masters:
            m.grad = None

    def state(self) -> list[dict[str, Any]]:
        """Each shard's optimizer state (tensors cloned), in shard order, for checkpoints."""
        if self.inner is None:
            return self._pending or []
        out = []
        for group in self.inner.param_groups:
            st = self.inner.state.get(group["params"][0], {})
            out.append({k: v.clone() if torch.is_tensor(v) else v for k, v in st.items()})
        return out

    def load(self, saved: list[dict[str, Any]]) -> None:
        if self.inner is None:  # the shards are known at the first step
            self._pending = saved or None
            return
        if not saved:  # a fresh optimizer state
            self.inner.state.clear()
            return
        for group, st in zip(self.inner.param_groups, saved, strict=True):
            p = group["params"][0]
            self.inner.state[p] = {
                k: v.to(p.device).clone() if torch.is_tensor(v) else v for k, v in st.items()
            }
        self._pending = None

    @property
    def nbytes(self) -> int:
        if self.inner is None:
            return 0
        return sum(
            v.numel() * v.element_size()
            for st in self.inner.state.values()
            for v in st.values()
            if torch.is_tensor(v) and v.dim() > 0
        )


class ZeroOptimizer(torch.optim.Optimizer):
    """What ``initialize`` returns as the optimizer: the param groups and their
    hyperparameters (LR schedules, DeepSpeed's and torch's alike, rewrite ``lr`` here).

    It subclasses torch.optim.Optimizer only so torch's LR schedulers (and Hugging Face's
    LambdaLR ones) accept it; the update itself is the engine's (``engine.step()``), on flat
    fp32 master shards. ``Optimizer.__init__`` is deliberately not called: it imports
    torch._dynamo (~8 s on a CPU box) and would hold per-parameter state we never use."""

    def __init__(
        self,
        groups: list[dict[str, Any]],
        *,
        defaults: dict[str, Any],
        name: str,
        decoupled: bool,
        torch_class: type[torch.optim.Optimizer] | None = None,
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
        self.shard_optimizer = ShardOptimizer(torch_class) if torch_class is not None else None
        """None: Adam(W) by :func:`adam_step`; else that torch optimizer on the shards."""

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
