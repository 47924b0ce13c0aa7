"""The ``zero_optimization`` block (with its offload sub-blocks) and the ``aio`` block.

Key names, aliases and defaults are DeepSpeed's (deepspeed/runtime/zero/config.py,
zero/offload_config.py, swap_tensor/aio_config.py, v0.19.x). Stage 3 keys are parsed here so
the stage-3 coordinator and the offload strategies only consume them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from .config_parse import Block, Deprecated, Ignored, KeyStatus, Refused, ignored, refused

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
    pipeline_read: bool = ignored(
        False, "overlaps DeepSpeed's NVMe reads with the step (speed); reads are prefetched here"
    )
    pipeline_write: bool = ignored(
        False, "overlaps DeepSpeed's NVMe writes with the step (speed); writes trail the step here"
    )
    fast_init: bool = ignored(False, "DeepSpeed's NVMe swap-file initialization shortcut (speed)")
    ratio: float = 1.0
    """Fraction of the optimizer step run on the CPU (the rest stays on the device)."""

    AUTO_IS_DEFAULT: ClassVar[bool] = True
    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "super_offload": Ignored("DeepSpeed's CPU-Adam scheduling across cores (speed)"),
        "cpuadam_cores_perc": Ignored("share of CPU cores DeepSpeed's CPU Adam uses (speed)"),
    }

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

    AUTO_IS_DEFAULT: ClassVar[bool] = True

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
    allgather_partitions: bool = refused(
        True, "gathering parameters by broadcasting each partition is not built"
    )
    allgather_bucket_size: int = 500_000_000
    """Elements per parameter all-gather after the step (stages 1-2 gather per reduce bucket)."""
    overlap_comm: bool | None = None
    """Reduce gradients during backward. None = DeepSpeed's default: True for stage 3, else False."""
    load_from_fp32_weights: bool = ignored(
        True, "masters are always restored from the fp32 copies in the checkpoint"
    )
    elastic_checkpoint: bool = ignored(
        False, "DeepSpeed's elastic checkpoint layout; checkpoints reload at the same world size"
    )
    ignore_unused_parameters: bool = ignored(
        True, "parameters without a gradient always count as zero gradients here"
    )
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
    AUTO_IS_DEFAULT: ClassVar[bool] = True
    KEYS: ClassVar[dict[str, KeyStatus]] = {
        # DeepSpeed's deprecated spellings, rewritten as DeepSpeed does (runtime/zero/config.py)
        "cpu_offload": Deprecated(
            "offload_optimizer", lambda on: {"device": "cpu"} if on else None
        ),
        "cpu_offload_param": Deprecated(
            "offload_param", lambda on: {"device": "cpu"} if on else None
        ),
        "cpu_offload_use_pin_memory": Ignored("deprecated; DeepSpeed ignores it too"),
        # speed and memory knobs of DeepSpeed's own implementation: the values are the same
        "round_robin_gradients": Ignored(
            "the order in which DeepSpeed's ranks copy gradients to the CPU (speed); the values "
            "are the same"
        ),
        "use_multi_rank_bucket_allreduce": Ignored("how DeepSpeed batches its all-reduces (speed)"),
        "compute_grad_norm": Ignored(
            "DeepSpeed may skip the gradient norm for speed; the engine always computes it"
        ),
        "parameter_alignment": Ignored("DeepSpeed's partition alignment for its kernels (speed)"),
        "memory_efficient_linear": Ignored(
            "DeepSpeed's stage-3 linear autograd function (memory); the values are the same"
        ),
        "module_granularity_threshold": Ignored(
            "groups small stage-3 modules into one fetch (speed)"
        ),
        "use_all_reduce_for_fetch_params": Ignored(
            "fetches stage-3 parameters with all-reduce instead of all-gather (speed)"
        ),
        "allgather_sequential": Ignored(
            "issues DeepSpeed's stage-3 all-gathers one by one (speed)"
        ),
        "zero_hpz_partition_size": Ignored(
            "ZeRO++ secondary weight partition inside a node (communication); same values"
        ),
        "pipeline_loading_checkpoint": Ignored("DeepSpeed's pipelined checkpoint loading (speed)"),
        "override_module_apply": Ignored(
            "DeepSpeed gathers stage-3 parameters inside module.apply(); here apply() sees the "
            "partitioned placeholders (use GatheredParameters)"
        ),
        "log_trace_cache_warnings": Ignored("DeepSpeed's stage-3 trace-cache log"),
        "enable_sanity_checks": Ignored("DeepSpeed's own debug assertions"),
        "save_muon_momentum_buffer_in_memory": Ignored("applies to the Muon optimizer only"),
        "leaf_module": Ignored("DeepSpeed's stage-3 leaf modules (fetch granularity, speed)"),
        # would change the numbers
        "legacy_stage1": Refused("DeepSpeed's old stage-1 implementation is not built", (False,)),
        "zero_quantized_weights": Refused("ZeRO++ quantized weights change the numbers", (False,)),
        "zero_quantized_nontrainable_weights": Refused(
            "ZeRO++ quantized frozen weights change the numbers", (False,)
        ),
        "zero_quantized_gradients": Refused(
            "ZeRO++ quantized gradients change the numbers", (False,)
        ),
        "zenflow": Refused("ZenFlow's selective, stale updates change the numbers; not built"),
        "mics_shard_size": Refused(
            "MiCS was removed from DeepSpeed 0.19.8, which refuses it too", (-1,)
        ),
        "mics_hierarchical_params_gather": Refused(
            "MiCS was removed from DeepSpeed 0.19.8, which refuses it too", (False,)
        ),
        "zeropp_loco_param": Refused(
            "LoCo-ZeRO++ was removed from DeepSpeed 0.19.8, which refuses it too"
        ),
    }

    def __post_init__(self) -> None:
        if self.stage not in (0, 1, 2, 3):
            raise ValueError(f"stage must be 0, 1, 2 or 3, got {self.stage}")
        if self.overlap_comm is None:
            self.overlap_comm = self.stage == 3
        if self.reduce_bucket_size < 1:
            raise ValueError(f"reduce_bucket_size must be >= 1, got {self.reduce_bucket_size}")
        if self.allgather_bucket_size < 0:
            raise ValueError(
                f"allgather_bucket_size must be >= 0, got {self.allgather_bucket_size}"
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


# DeepSpeed's stage3_ spellings of the ignored stage-3 knobs.
ZeroConfig.KEYS.update(
    {
        f"stage3_{name}": ZeroConfig.KEYS[name]
        for name in (
            "module_granularity_threshold",
            "use_all_reduce_for_fetch_params",
            "allgather_sequential",
        )
    }
)

_AIO = "tunes DeepSpeed's libaio library (speed); NVMe swapping here uses plain file I/O"


@dataclass(kw_only=True, slots=True)
class AioConfig(Block):
    """``aio``: DeepSpeed's libaio settings for NVMe swapping (its defaults). They tune the speed
    of DeepSpeed's own async-I/O library; engine/nvme.py swaps with plain file I/O, so they are
    read, checked and reported as ignored."""

    block_size: int = ignored(1_048_576, _AIO)
    queue_depth: int = ignored(8, _AIO)
    intra_op_parallelism: int = ignored(1, _AIO)
    single_submit: bool = ignored(False, _AIO)
    overlap_events: bool = ignored(True, _AIO)
    use_gds: bool = ignored(False, _AIO)

    ALIASES: ClassVar[dict[str, str]] = {"thread_count": "intra_op_parallelism"}
