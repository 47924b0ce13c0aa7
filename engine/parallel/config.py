"""The ds_config blocks of 3D parallelism: ``pipeline`` (DeepSpeed runtime/config.py
``get_pipeline_config``: keys and defaults) and ``tensor_parallel`` (DeepSpeed
runtime/tensor_parallel/config.py ``TPTrainingConfig``: ``autotp_size``, ``partition_config``).

Accepted with no effect here: ``pipeline.stages`` / ``partition`` (DeepSpeed's engine does not
read them either: the PipelineModule decides), ``pipe_partitioned`` / ``grad_partitioned``
(DeepSpeed splits activations sent between stages over the tensor-parallel group; here each
tensor shard sends its own full activation), ``use_reentrant`` (activation checkpointing is
always torch's non-reentrant one), ``tensor_parallel.tp_overlap_comm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from zeroscope.engine.config_parse import Block, KeyStatus, Refused


@dataclass(kw_only=True, slots=True)
class PipelineConfig(Block):
    """``pipeline``: how a PipelineModule's micro-batches are scheduled."""

    stages: int | str = "auto"
    partition: str = "best"
    seed_layers: bool = False
    activation_checkpoint_interval: int = 0
    """> 0 overrides the PipelineModule's own interval (layers per checkpointed segment)."""
    pipe_partitioned: bool = True
    grad_partitioned: bool = True
    use_reentrant: bool | None = None
    schedule: str = "1f1b"
    """zeroscope: the torch.distributed.pipelining schedule: ``1f1b`` (DeepSpeed's
    TrainSchedule), ``gpipe``, ``interleaved_1f1b``, ``looped_bfs``,
    ``interleaved_zero_bubble``, ``zbv_zero_bubble``, ``dualpipev``."""

    AUTO_IS_DEFAULT: ClassVar[bool] = True
    """``"stages": "auto"`` is DeepSpeed's own default value there, not a placeholder to fill."""

    def __post_init__(self) -> None:
        if self.activation_checkpoint_interval < 0:
            raise ValueError(
                f"pipeline.activation_checkpoint_interval must be >= 0, got "
                f"{self.activation_checkpoint_interval}"
            )


@dataclass(kw_only=True, slots=True)
class TensorParallelConfig(Block):
    """``tensor_parallel``: AutoTP training (tensor parallel size and layer rules)."""

    autotp_size: int = 0
    """Tensor-parallel ranks per model replica (0 or 1 = off)."""
    partition_config: Any = None
    """``{"layer_specs": [{"patterns": [regex, ...], "partition_type": "column"|"row"}]}``."""
    tp_overlap_comm: bool = False

    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "tp": Refused("AutoTP's inference-side settings are not built; use autotp_size"),
        "dtype": Refused("the training precision comes from fp16/bf16 here; not built"),
        "vocab_parallel_lm_head": Refused("a vocabulary-parallel lm_head is not built"),
        "injection_policy_tuple": Refused("AutoTP injection policies are not built"),
    }

    def __post_init__(self) -> None:
        if self.autotp_size < 0:
            raise ValueError(f"tensor_parallel.autotp_size must be >= 0, got {self.autotp_size}")
        if self.partition_config is not None and not isinstance(self.partition_config, dict):
            raise ValueError("tensor_parallel.partition_config must be an object {...}")

    @property
    def size(self) -> int:
        return max(1, self.autotp_size)
