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
        groups=groups, comm=comm, policy=policy, bucket_size=zero.reduce_bucket_size
    )
