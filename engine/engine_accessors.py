"""DeepSpeed's read-only engine accessors (runtime/engine.py), for scripts and integrations
(accelerate, the Hugging Face Trainer) that ask the engine about its config instead of reading
the ds_config themselves. They read the typed, resolved config (``self._config``), so a value
is the one training actually uses (batch sizes resolved, aliases applied).

Kept apart from engine/engine.py, which holds the training loop.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .config import DeepSpeedConfig
    from .optim import ZeroOptimizer
    from .process_group import Comm


class EngineAccessors:
    """Mixed into :class:`~.engine.ZeroEngine`; every method is DeepSpeed's, same name and
    meaning."""

    _config: DeepSpeedConfig
    config: dict[str, Any]
    comm: Comm
    device: torch.device
    module: torch.nn.Module
    optimizer: ZeroOptimizer
    lr_scheduler: Any
    _grad_norm: torch.Tensor | None

    # -- batch ---------------------------------------------------------------------------------

    def train_batch_size(self) -> int:
        return self._config.train_batch_size or 0

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.micro_batch

    def gradient_accumulation_steps(self) -> int:
        return self._config.accumulation_steps

    def steps_per_print(self) -> float:
        return self._config.steps_per_print

    def gradient_clipping(self) -> float:
        return self._config.gradient_clipping

    def wall_clock_breakdown(self) -> bool:
        """As configured (accepted and ignored: zeroscope always times the phases)."""
        return bool(self.config.get("wall_clock_breakdown", False))

    def dataloader_drop_last(self) -> bool:
        return self._config.dataloader_drop_last

    # -- ZeRO ----------------------------------------------------------------------------------

    def zero_optimization(self) -> bool:
        """True when a ZeRO stage above 0 is on."""
        return self._config.zero_optimization.stage > 0

    def zero_optimization_stage(self) -> int:
        return self._config.zero_optimization.stage

    def zero_optimization_partition_gradients(self) -> bool:
        return self._config.zero_optimization.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self._config.zero_optimization.stage == 3

    def zero_offload_optimizer(self) -> bool:
        return self._config.zero_optimization.offload_optimizer.device != "none"

    def zero_offload_param(self) -> bool:
        return self._config.zero_optimization.offload_param.device != "none"

    def zero_cpu_offload(self) -> bool:
        return self._config.zero_optimization.offload_optimizer.device == "cpu"

    def zero_overlap_comm(self) -> bool:
        return self._config.zero_optimization.overlap

    def zero_reduce_scatter(self) -> bool:
        return self._config.zero_optimization.reduce_scatter

    def zero_contiguous_gradients(self) -> bool:
        return self._config.zero_optimization.contiguous_gradients

    def zero_reduce_bucket_size(self) -> int:
        return self._config.zero_optimization.reduce_bucket_size

    def zero_allgather_bucket_size(self) -> int:
        return self._config.zero_optimization.allgather_bucket_size

    def zero_sub_group_size(self) -> int:
        return self._config.zero_optimization.sub_group_size

    def zero_param_persistence_threshold(self) -> int:
        return self._config.zero_optimization.stage3_param_persistence_threshold

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """Stage 3: whether ``save_16bit_model`` / the consolidated state dict may gather the
        full weights (accelerate asks before calling ``_zero3_consolidated_16bit_state_dict``)."""
        return self._config.zero_optimization.stage3_gather_16bit_weights_on_model_save

    def zero_allow_untested_optimizer(self) -> bool:
        return self._config.zero_allow_untested_optimizer

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return self._config.zero_force_ds_cpu_optimizer

    # -- precision -----------------------------------------------------------------------------

    def fp16_enabled(self) -> bool:
        return self._config.precision == "fp16"

    def bfloat16_enabled(self) -> bool:
        return self._config.precision == "bf16"

    def dynamic_loss_scale(self) -> bool:
        return self._config.fp16.dynamic

    def initial_dynamic_scale(self) -> float:
        return float(2**self._config.fp16.initial_scale_power)

    # -- optimizer and schedule ----------------------------------------------------------------

    def optimizer_name(self) -> str | None:
        return self._config.optimizer.type if self._config.optimizer is not None else None

    def optimizer_params(self) -> dict[str, Any] | None:
        opt = self._config.optimizer
        if opt is None:
            return None
        p = opt.params
        return {"lr": p.lr, "betas": list(p.betas), "eps": p.eps, "weight_decay": p.weight_decay}

    def scheduler_name(self) -> str | None:
        return self._config.scheduler.type if self._config.scheduler is not None else None

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_mom(self) -> list[tuple[float, float]]:
        """Adam's betas per param group (DeepSpeed's momentum for Adam-type optimizers)."""
        return [(float(g["betas"][0]), float(g["betas"][1])) for g in self.optimizer.param_groups]

    def get_type(self) -> list[str]:
        return [type(self.optimizer).__name__ for _ in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        """The global L2 norm of the last applied step's gradients (before clipping); None
        before the first step and after an overflowing one."""
        return None if self._grad_norm is None else float(self._grad_norm)

    # -- ranks and devices ---------------------------------------------------------------------

    @property
    def local_rank(self) -> int:
        """torchrun's LOCAL_RANK (DeepSpeed reads the same variable); 0 without one."""
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def global_rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def dp_world_size(self) -> int:
        return self.comm.world_size

    @property
    def mp_world_size(self) -> int:
        """Model-parallel size: always 1 (no tensor or pipeline parallelism here)."""
        return 1

    def get_data_parallel_rank(self) -> int:
        return self.comm.rank

    def get_model_parallel_rank(self) -> int:
        return 0
