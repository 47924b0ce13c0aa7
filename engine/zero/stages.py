"""Pick the strategy for a ZeRO stage (the protocol is in zero/strategy.py).

Stages 0-2 are one mechanism with three policies (zero/bucketed.py). Stage 3 lives in
zero/stage3*.py and is constructed with the same keyword arguments:
``Stage3Strategy(module=..., groups=..., comm=..., config=...)``.
"""

from __future__ import annotations

import torch

from zeroscope.engine.config import ConfigError, DeepSpeedConfig
from zeroscope.engine.process_group import Comm

from .bucketed import BucketedStrategy, Policy
from .strategy import ZeroStrategy


def make_strategy(
    *,
    module: torch.nn.Module,
    groups: list[list[torch.nn.Parameter]],
    comm: Comm,
    config: DeepSpeedConfig,
) -> ZeroStrategy:
    """The strategy object for ``config.zero_optimization.stage``."""
    zero = config.zero_optimization
    if zero.stage == 3:
        try:
            from .stage3 import Stage3Strategy  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            raise ConfigError("zero_optimization.stage 3 is not supported yet") from None
        strategy: ZeroStrategy = Stage3Strategy(
            module=module, groups=groups, comm=comm, config=config
        )
        return strategy
    policy = Policy(
        stage=zero.stage,
        shards=1 if zero.stage == 0 else comm.world_size,
        reduce_every_micro_step=zero.stage == 2,
        reduce_scatter=zero.reduce_scatter,
        overlap=zero.overlap,
        contiguous=zero.contiguous_gradients,
        offload_optimizer=zero.offload_optimizer.device != "none",
    )
    return BucketedStrategy(
        groups=groups,
        comm=comm,
        policy=policy,
        bucket_size=zero.reduce_bucket_size,
        frozen=frozen_params(module, groups),
    )


def frozen_params(
    module: torch.nn.Module, groups: list[list[torch.nn.Parameter]]
) -> list[torch.Tensor]:
    """The module's parameters the optimizer never steps (``requires_grad=False``: a LoRA
    fine-tune's base model). Stages 0-2 leave them whole in the module on every rank, in the
    compute dtype, as DeepSpeed does (its flat groups hold only what the optimizer steps); they
    are memory all the same, so P counts them. Each is the rank-local tensor (a DTensor's
    local shard under tensor parallelism)."""
    stepped = {id(p) for group in groups for p in group}
    out = []
    for p in module.parameters():
        if p.requires_grad or id(p) in stepped:
            continue
        local = getattr(p, "_local_tensor", None)
        out.append(local if isinstance(local, torch.Tensor) else p)
    return out
