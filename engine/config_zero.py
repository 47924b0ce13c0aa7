"""The ``zero_optimization`` block (with its offload sub-blocks) and the ``aio`` block.

Key names, aliases and defaults are DeepSpeed's (deepspeed/runtime/zero/config.py,
zero/offload_config.py, swap_tensor/aio_config.py, v0.19.x). Stage 3 keys are parsed here so
the stage-3 coordinator and the offload strategies only consume them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .config_parse import REJECT_ANY, Block

OffloadDevice = Literal["none", "cpu", "nvme"]


@dataclass(kw_only=True, slots=True)
class OffloadOptimizerConfig(Block):
    """``zero_optimization.offload_optimizer``: where O (fp32 master + Adam m, v) lives."""

    device: OffloadDevice = "none"
    """none | cpu | nvme (ZeRO-Offload / ZeRO-Infinity)."""
    nvme_path: str | None = None
    """Folder for the swap files when device is nvme."""
    buffer_count: int = 4
    """Pinned staging buffers for NVMe swapping."""
    pin_memory: bool = True
    """Page-locked host buffers: fast async copies (default True since DeepSpeed 0.19.5)."""
    pipeline_read: bool = False
    pipeline_write: bool = False
    """Overlap NVMe reads / writes of the next sub-group with the current optimizer step."""
    fast_init: bool = False
    ratio: float = 1.0
    """Fraction of the optimizer step run on the CPU (the rest stays on the device)."""

    ALIASES: ClassVar[dict[str, str]] = {}
    UNSUPPORTED: ClassVar[dict[str, Any]] = {"pipeline": False}

    def __post_init__(self) -> None:
        if self.device == "nvme" and not self.nvme_path:
            raise ValueError("offload_optimizer.nvme_path is required when device is nvme")
        if not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"offload_optimizer.ratio must be in [0, 1], got {self.ratio}")
        if self.buffer_count < 1:
            raise ValueError(
                f"offload_optimizer.buffer_count must be >= 1, got {self.buffer_count}"
            )


@dataclass(kw_only=True, slots=True)
class OffloadParamConfig(Block):
    """``zero_optimization.offload_param`` (stage 3 only): where the 16-bit parameter shards
    live between uses."""

    device: OffloadDevice = "none"
    nvme_path: str | None = None
    buffer_count: int = 5
    buffer_size: int = 100_000_000
    """Elements per NVMe staging buffer."""
    max_in_cpu: int = 1_000_000_000
    """Elements of parameters kept in host memory when device is nvme."""
    pin_memory: bool = True

    def __post_init__(self) -> None:
        if self.device == "nvme" and not self.nvme_path:
            raise ValueError("offload_param.nvme_path is required when device is nvme")


@dataclass(kw_only=True, slots=True)
class ZeroConfig(Block):
    """``zero_optimization``. Sizes are element counts, as in DeepSpeed."""

    stage: int = 0
    """0: plain data parallel; 1: O sharded; 2: O and G sharded; 3: O, G and P sharded."""
    contiguous_gradients: bool = True
    """Keep gradients in one flat buffer (no fragmentation, no copy at reduction)."""
    reduce_scatter: bool = True
    """Average gradients with reduce-scatter (False: all-reduce, then keep this rank's part)."""
    reduce_bucket_size: int = 500_000_000
    """Elements per gradient-reduction bucket."""
    allgather_partitions: bool = True
    allgather_bucket_size: int = 500_000_000
    """Elements per parameter all-gather after the step (stages 1-2 gather per reduce bucket)."""
    overlap_comm: bool | None = None
    """Reduce gradients during backward. None = DeepSpeed's default: True for stage 3, else False."""
    load_from_fp32_weights: bool = True
    elastic_checkpoint: bool = False
    ignore_unused_parameters: bool = True
    """Parameters without a gradient count as zero gradients (DeepSpeed's default)."""
    offload_optimizer: OffloadOptimizerConfig = field(default_factory=OffloadOptimizerConfig)
    offload_param: OffloadParamConfig = field(default_factory=OffloadParamConfig)
    sub_group_size: int = 1_000_000_000
    """Stage 3: elements per optimizer sub-group (bounds the fp32 working set of one step)."""
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_param_persistence_threshold: int = 100_000
    """Stage 3: parameters with at most this many elements are never sharded."""
    stage3_model_persistence_threshold: int = 2**63 - 1
    stage3_max_live_parameters: int = 1_000_000_000
    stage3_max_reuse_distance: int = 1_000_000_000
    stage3_gather_16bit_weights_on_model_save: bool = False
    """Stage 3: gather full 16-bit weights when saving (else each rank saves only its shard)."""

    ALIASES: ClassVar[dict[str, str]] = {
        "prefetch_bucket_size": "stage3_prefetch_bucket_size",
        "param_persistence_threshold": "stage3_param_persistence_threshold",
        "model_persistence_threshold": "stage3_model_persistence_threshold",
        "max_live_parameters": "stage3_max_live_parameters",
        "max_reuse_distance": "stage3_max_reuse_distance",
        "gather_16bit_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save": "stage3_gather_16bit_weights_on_model_save",
    }
    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        "round_robin_gradients": False,
        "use_multi_rank_bucket_allreduce": True,
        "cpu_offload": False,  # deprecated in DeepSpeed: use offload_optimizer
        "cpu_offload_param": False,
        "cpu_offload_use_pin_memory": False,
        "legacy_stage1": False,
        "zero_hpz_partition_size": 1,
        "zero_quantized_weights": False,
        "zero_quantized_nontrainable_weights": False,
        "zero_quantized_gradients": False,
        "mics_shard_size": -1,
        "mics_hierarchical_params_gather": False,
        "memory_efficient_linear": True,
        "pipeline_loading_checkpoint": False,
        "override_module_apply": True,
        "module_granularity_threshold": 0,
        "use_all_reduce_for_fetch_params": False,
        "log_trace_cache_warnings": False,
        "stage3_use_all_reduce_for_fetch_params": False,
        "zenflow": REJECT_ANY,
    }

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.overlap_comm is None:
            self.overlap_comm = self.stage == 3
        if self.reduce_bucket_size < 1:
            raise ValueError(f"reduce_bucket_size must be >= 1, got {self.reduce_bucket_size}")
        if self.allgather_bucket_size < 1:
            raise ValueError(
                f"allgather_bucket_size must be >= 1, got {self.allgather_bucket_size}"
            )
        if not self.allgather_partitions:
            raise ValueError(
                "allgather_partitions=false (broadcast per partition) is not supported yet"
            )
        if self.offload_param.device != "none" and self.stage != 3:
            # DeepSpeed documents offload_param as "Valid only with stage 3" yet silently
            # accepts it (and does nothing) at stages 0-2; refuse instead.
            raise ValueError(
                f"offload_param is valid only with stage 3 (only stage 3 partitions the "
                f"parameters, so there is nothing to offload), got stage {self.stage}"
            )
        if self.offload_optimizer.device != "none" and self.stage == 0:
            raise ValueError(
                "offload_optimizer needs stage 1, 2 or 3 (DeepSpeed: ZeRO-Offload works on "
                "the partitioned optimizer), got stage 0"
            )

    @property
    def overlap(self) -> bool:
        """overlap_comm resolved (never None after construction)."""
        return bool(self.overlap_comm)


@dataclass(kw_only=True, slots=True)
class AioConfig(Block):
    """``aio``: libaio settings for NVMe swapping (DeepSpeed's defaults)."""

    block_size: int = 1_048_576
    queue_depth: int = 8
    intra_op_parallelism: int = 1
    single_submit: bool = False
    overlap_events: bool = True
    use_gds: bool = False

    ALIASES: ClassVar[dict[str, str]] = {"thread_count": "intra_op_parallelism"}
