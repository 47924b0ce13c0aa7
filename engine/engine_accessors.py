"""DeepSpeed's read-only engine accessors (runtime/engine.py), for scripts and integrations
(accelerate, the Hugging Face Trainer) that ask the engine about its config instead of reading
the ds_config themselves. They read the typed, resolved config (``self._config``), so a value
is the one training actually uses (batch sizes resolved, aliases applied).

Kept apart from engine/engine.py, which holds the training loop.
"""

from __future__ import annotations

import os
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .config import DeepSpeedConfig
    from .optim import ZeroOptimizer
    from .precision import LossScaler
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
    scaler: LossScaler

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

    def zero_prefetch_bucket_size(self) -> int:
        return self._config.zero_optimization.stage3_prefetch_bucket_size

    def zero_max_live_parameters(self) -> int:
        return self._config.zero_optimization.stage3_max_live_parameters

    def zero_max_reuse_distance(self) -> int:
        return self._config.zero_optimization.stage3_max_reuse_distance

    def zero_model_persistence_threshold(self) -> int:
        return self._config.zero_optimization.stage3_model_persistence_threshold

    def zero_allgather_partitions(self) -> bool:
        return self._config.zero_optimization.allgather_partitions

    def zero_elastic_checkpoint(self) -> bool:
        return self._config.zero_optimization.elastic_checkpoint

    def zero_ignore_unused_parameters(self) -> bool:
        return self._config.zero_optimization.ignore_unused_parameters

    def zero_load_from_fp32_weights(self) -> bool:
        return self._config.zero_optimization.load_from_fp32_weights

    def zero_nvme_offload_optimizer(self) -> bool:
        return self._config.zero_optimization.offload_optimizer.device == "nvme"

    def zero_use_cpu_optimizer(self) -> bool:
        return self._config.zero_optimization.offload_optimizer.device in ("cpu", "nvme")

    def zero_allow_untested_optimizer(self) -> bool:
        return self._config.zero_allow_untested_optimizer

    def zero_force_ds_cpu_optimizer(self) -> bool:
        return self._config.zero_force_ds_cpu_optimizer

    # -- precision -----------------------------------------------------------------------------

    def fp16_enabled(self) -> bool:
        return self._config.precision == "fp16"

    def bfloat16_enabled(self) -> bool:
        return self._config.precision == "bf16"

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 without fp16). DeepSpeed's ``loss_scale()`` is a method
        returning the configured static scale; its current scale is this one."""
        return self.scaler.loss_scale

    def dynamic_loss_scale(self) -> bool:
        return self._config.fp16.dynamic

    def initial_dynamic_scale(self) -> float:
        return float(2**self._config.fp16.initial_scale_power)

    def get_data_types(self) -> tuple[torch.dtype, torch.dtype]:
        """(model dtype, gradient-accumulation dtype): the training dtype for both here."""
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(
            self._config.precision, torch.float32
        )
        return dtype, dtype

    def dynamic_loss_scale_args(self) -> dict[str, float] | None:
        fp16 = self._config.fp16
        if not (self._config.precision == "fp16" and fp16.dynamic):
            return None
        return {
            "init_scale": float(2**fp16.initial_scale_power),
            "scale_window": fp16.loss_scale_window,
            "delayed_shift": fp16.hysteresis,
            "consecutive_hysteresis": fp16.consecutive_hysteresis,
            "min_scale": fp16.min_loss_scale,
        }

    # -- features not built: what DeepSpeed answers when they are off --------------------------

    def communication_data_type(self) -> torch.dtype | None:
        return None

    def postscale_gradients(self) -> bool:
        return True

    def gradient_predivide_factor(self) -> float:
        return 1.0

    def managed_gradient_accumulation(self) -> bool:
        return True

    def memory_breakdown(self) -> bool:
        return False

    def flops_profiler_enabled(self) -> bool:
        return False

    def autotuning_enabled(self) -> bool:
        return False

    def torch_autocast_enabled(self) -> bool:
        return False

    def fp16_auto_cast(self) -> bool:
        return False

    def data_efficiency_enabled(self) -> bool:
        return False

    def curriculum_learning_enabled(self) -> bool:
        return False

    def random_ltd_enabled(self) -> bool:
        return False

    def zero_legacy_stage1(self) -> bool:
        return False

    def zero_quantized_weights(self) -> bool:
        return False

    def zero_quantized_nontrainable_weights(self) -> bool:
        return False

    def zero_quantized_gradients(self) -> bool:
        return False

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

    def scheduler_params(self) -> dict[str, Any] | None:
        sched = self._config.scheduler
        if sched is None:
            return None
        return {f.name: getattr(sched.params, f.name) for f in fields(sched.params)}

    def get_batch_info(self) -> tuple[int, int, int]:
        """(train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)."""
        return (
            self.train_batch_size(),
            self.train_micro_batch_size_per_gpu(),
            self.gradient_accumulation_steps(),
        )

    def get_mom(self) -> list[tuple[float, float]]:
        """Adam's betas per param group (DeepSpeed's momentum for Adam-type optimizers)."""
        return [(float(g["betas"][0]), float(g["betas"][1])) for g in self.optimizer.param_groups]

    def get_type(self) -> list[str]:
        return [type(self.optimizer).__name__ for _ in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        """The global L2 norm of the last step's gradients (before clipping); None before the
        first step, ``inf`` after a step skipped for inf/NaN gradients (as DeepSpeed)."""
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
