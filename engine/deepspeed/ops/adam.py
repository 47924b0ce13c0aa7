"""``deepspeed.ops.adam``: ``DeepSpeedCPUAdam`` and ``FusedAdam`` with DeepSpeed's constructors.

They are ``torch.optim.Adam`` objects (decoupled weight decay in AdamW mode, DeepSpeed's
default) that ``initialize(optimizer=...)`` takes over like any client Adam: the engine applies
the same Adam(W) update on its fp32 master shards wherever they live (device, CPU or NVMe), so
which kernel DeepSpeed would have used changes nothing here. accelerate builds a
``DeepSpeedCPUAdam`` from the user's optimizer when ``offload_optimizer`` is on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def _check(bias_correction: bool, amsgrad: bool) -> None:
    if not bias_correction:
        raise ValueError("bias_correction=False is not built: the engine's Adam corrects bias")
    if amsgrad:
        raise ValueError("amsgrad is not built")


class DeepSpeedCPUAdam(torch.optim.Adam):
    def __init__(
        self,
        model_params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
    ) -> None:
        _check(bias_correction, amsgrad)
        if not fp32_optimizer_states:
            raise ValueError("fp32_optimizer_states=False is not built: Adam states are fp32")
        super().__init__(
            model_params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=adamw_mode,
        )


class FusedAdam(torch.optim.Adam):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
    ) -> None:
        _check(bias_correction, amsgrad)
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            decoupled_weight_decay=adam_w_mode,
        )


__all__ = ["DeepSpeedCPUAdam", "FusedAdam"]
