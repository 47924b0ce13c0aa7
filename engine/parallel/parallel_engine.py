"""The engine for a job with model parallelism (tensor and/or pipeline): a ZeroEngine whose ZeRO
strategy works over the data-parallel group only, and whose optimizer step agrees with the other
stages and tensor shards of its replica on two things (DeepSpeed does the same over
``mpu.get_model_parallel_group()``):

- the fp16 overflow flag (all-reduce MAX): one stage skipping a step alone would desynchronize
  the replica;
- the global gradient norm for clipping: each rank's sum of squares, all-reduced over the
  replica. A parameter held by several ranks of the replica with identical gradients (one
  replicated across tensor shards, a weight tied across stages) is counted on one of them only;
  those are the optimizer groups in ``uncounted_groups`` (see :mod:`.setup`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from zeroscope.engine.config import ConfigError
from zeroscope.engine.engine import ZeroEngine
from zeroscope.engine.precision import local_overflow

from .setup import ParallelContext


class ParallelEngine(ZeroEngine):
    """ZeroEngine + the model-parallel agreements above."""

    def __init__(self, *, parallel: ParallelContext, **engine_args: Any) -> None:
        super().__init__(**engine_args)
        self.parallel = parallel
        self.mpu = parallel.mpu
        self._report_layout()

    @property
    def global_rank(self) -> int:
        """The rank in the whole job, as DeepSpeed's (``comm`` is the data-parallel group)."""
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        """Every rank of the job (DeepSpeed's ``world_size``; ``dp_world_size`` is ZeRO's)."""
        return dist.get_world_size() if dist.is_initialized() else 1

    def _report_layout(self) -> None:
        self.reporter.layout(self.parallel.coords, self._pipeline_layout())

    def _pipeline_layout(self) -> dict[str, Any] | None:
        return None

    def _overflow(self, grads: list[torch.Tensor]) -> bool:
        flag = local_overflow(grads, device=self.device)
        if self.strategy.sharded:
            self.comm.all_reduce(flag, op=dist.ReduceOp.MAX, label="overflow").wait()
        mp = self.parallel.mp_comm
        mp.all_reduce(flag, op=dist.ReduceOp.MAX, label="overflow").wait()
        return bool(flag.item())

    def _grad_norm_sq(self, grads32: list[torch.Tensor]) -> torch.Tensor:
        sq = torch.zeros(1, dtype=torch.float32, device=self.device)
        skip = self.parallel.uncounted_groups
        for shard, g in zip(self.strategy.shards, grads32):
            if shard.group not in skip:
                sq += g.pow(2).sum()
        if self.strategy.sharded:
            self.comm.all_reduce(sq, label="grad_norm").wait()
        self.parallel.mp_comm.all_reduce(sq, label="grad_norm").wait()
        return sq

    # -- DeepSpeed's accessors for the parallel layout ----------------------------------------

    def get_data_parallel_rank(self) -> int:
        return self.parallel.coords.dp

    def get_data_parallel_world_size(self) -> int:
        return self.parallel.coords.dp_size

    def get_model_parallel_rank(self) -> int:
        return self.parallel.coords.tp

    def get_model_parallel_world_size(self) -> int:
        return self.parallel.coords.tp_size

    # -- not yet: checkpoints hold one model replica's files, and every stage / shard would
    # write the same names (DeepSpeed writes one file per layer and model-parallel rank) -----

    def save_checkpoint(self, save_dir: str, *args: Any, **kwargs: Any) -> bool:
        raise ConfigError(_NO_CHECKPOINTS)

    def load_checkpoint(self, load_dir: str, *args: Any, **kwargs: Any) -> Any:
        raise ConfigError(_NO_CHECKPOINTS)

    def save_16bit_model(self, save_dir: str, save_filename: str = "model.safetensors") -> bool:
        raise ConfigError(_NO_CHECKPOINTS)


_NO_CHECKPOINTS = (
    "checkpoints of pipeline- or tensor-parallel runs are not supported yet (each stage and "
    "tensor shard holds a different part of the model; DeepSpeed's per-layer layout is not built)"
)
