"""The smaller ds_config blocks: fp16, bf16, optimizer, scheduler, activation_checkpointing,
checkpoint. Names and defaults are DeepSpeed's (runtime/precision_config.py, runtime/config.py,
runtime/lr_schedules.py, runtime/activation_checkpointing/config.py, v0.19.x)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .config_parse import REJECT_ANY, Block, ConfigError, read_block, suggest


@dataclass(kw_only=True, slots=True)
class FP16Config(Block):
    """``fp16``: 16-bit params/grads with fp32 master weights and loss scaling."""

    enabled: bool = False
    loss_scale: float = 0.0
    """0 = dynamic loss scaling; > 0 = this static scale."""
    initial_scale_power: int = 16
    """The dynamic scale starts at 2**initial_scale_power."""
    loss_scale_window: int = 1000
    """Overflow-free steps before the scale doubles."""
    hysteresis: int = 2
    """Overflows tolerated before the scale halves."""
    consecutive_hysteresis: bool = False
    """Refill the hysteresis on every overflow-free step (not only when the scale grows)."""
    min_loss_scale: float = 1.0

    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        "auto_cast": False,
        "fp16_master_weights_and_grads": False,
    }

    def __post_init__(self) -> None:
        if self.loss_scale < 0:
            raise ValueError(f"fp16.loss_scale must be >= 0 (0 = dynamic), got {self.loss_scale}")
        if self.loss_scale_window < 1:
            raise ValueError(f"fp16.loss_scale_window must be >= 1, got {self.loss_scale_window}")
        if self.hysteresis < 1:
            raise ValueError(f"fp16.hysteresis must be >= 1, got {self.hysteresis}")
        if self.min_loss_scale <= 0:
            raise ValueError(f"fp16.min_loss_scale must be > 0, got {self.min_loss_scale}")

    @property
    def dynamic(self) -> bool:
        return self.loss_scale == 0


@dataclass(kw_only=True, slots=True)
class BF16Config(Block):
    """``bf16`` (alias ``bfloat16``): bf16 params/grads, fp32 master weights, no loss scaling."""

    enabled: bool = False

    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        "immediate_grad_update": REJECT_ANY,
        "check_grad_overflow": False,
        "bf16_master_weights_and_grads": False,
        "bf16_optimizer_states": False,
    }


@dataclass(kw_only=True, slots=True)
class AdamParams(Block):
    """``optimizer.params`` for Adam / AdamW (FusedAdam's defaults)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    adam_w_mode: bool = True
    """Decoupled weight decay (AdamW). DeepSpeed's ADAM_W_MODE_DEFAULT is True, so type "Adam"
    with weight_decay is AdamW-style unless adam_w_mode is false (runtime/config.py, engine.py
    _configure_basic_optimizer); type "AdamW" is AdamW-style always."""
    torch_adam: bool = False
    """DeepSpeed: use torch.optim's Adam instead of FusedAdam. Same math here; accepted."""
    bias_correction: bool = True

    UNSUPPORTED: ClassVar[dict[str, Any]] = {"amsgrad": False, "fused": REJECT_ANY}

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be in [0, 1), got {list(self.betas)}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if not self.bias_correction:
            raise ValueError("bias_correction=false is not supported yet")


_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """``optimizer``: {type, params}."""

    type: Literal["Adam", "AdamW"] = "AdamW"
    params: AdamParams = field(default_factory=AdamParams)

    @property
    def decoupled_weight_decay(self) -> bool:
        """True when weight decay is AdamW-style (see :attr:`AdamParams.adam_w_mode`)."""
        return self.type == "AdamW" or self.params.adam_w_mode


def _object(raw: Any, path: str) -> Mapping[str, Any]:
    """``raw`` if it is a JSON object (None reads as {}), else a one-line ConfigError."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path} must be an object {{...}}, got {raw!r}")
    return raw


def read_optimizer(raw: Mapping[str, Any]) -> OptimizerConfig:
    raw = _object(raw, "optimizer")
    unknown = set(raw) - {"type", "params"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"unknown key optimizer.{key}{suggest(key, ['type', 'params'])}")
    name = str(raw.get("type", "AdamW"))
    if name.lower() not in _OPTIMIZERS:
        raise ConfigError(
            f"optimizer.type {name!r} is not supported yet (supported: Adam, AdamW)"
            + suggest(name, list(_OPTIMIZERS.values()))
        )
    params = dict(_object(raw.get("params"), "optimizer.params"))
    if "max_grad_norm" in params:  # DeepSpeed refuses it too
        raise ConfigError(
            "optimizer.params.max_grad_norm is not an optimizer parameter: use the top-level "
            "gradient_clipping"
        )
    return OptimizerConfig(
        type=_OPTIMIZERS[name.lower()],  # type: ignore[arg-type]
        params=read_block(AdamParams, params, "optimizer.params"),
    )


WarmupType = Literal["log", "linear"]


@dataclass(kw_only=True, slots=True)
class WarmupLRParams(Block):
    warmup_min_lr: float = 0.0
    warmup_max_lr: float | None = None
    """None = the optimizer's lr (DeepSpeed >= 0.16; 0.001 before)."""
    warmup_num_steps: int = 1000
    warmup_type: WarmupType = "log"
    last_batch_iteration: int = -1

    def __post_init__(self) -> None:
        if self.warmup_num_steps <= 0:
            raise ValueError(
                f"warmup_num_steps must be a positive integer, got {self.warmup_num_steps}"
            )


@dataclass(kw_only=True, slots=True)
class WarmupDecayLRParams(Block):
    total_num_steps: int
    warmup_min_lr: float = 0.0
    warmup_max_lr: float | None = 0.001
    warmup_num_steps: int = 1000
    warmup_type: WarmupType = "log"
    last_batch_iteration: int = -1

    def __post_init__(self) -> None:
        if self.warmup_num_steps <= 0:
            raise ValueError(
                f"warmup_num_steps must be a positive integer, got {self.warmup_num_steps}"
            )


@dataclass(kw_only=True, slots=True)
class WarmupCosineLRParams(Block):
    total_num_steps: int
    warmup_min_ratio: float = 0.0
    warmup_num_steps: int = 1000
    cos_min_ratio: float = 0.0001
    warmup_type: WarmupType = "log"
    last_batch_iteration: int = -1

    def __post_init__(self) -> None:
        if self.warmup_num_steps <= 0:
            raise ValueError(
                f"warmup_num_steps must be a positive integer, got {self.warmup_num_steps}"
            )


SchedulerParams = WarmupLRParams | WarmupDecayLRParams | WarmupCosineLRParams
_SCHEDULERS: dict[str, type] = {
    "WarmupLR": WarmupLRParams,
    "WarmupDecayLR": WarmupDecayLRParams,
    "WarmupCosineLR": WarmupCosineLRParams,
}
_UNSUPPORTED_SCHEDULERS = ("LRRangeTest", "OneCycle", "WarmupCosineLR_legacy")


@dataclass(kw_only=True, slots=True)
class SchedulerConfig:
    """``scheduler``: {type, params}; stepped once per applied optimizer step."""

    type: Literal["WarmupLR", "WarmupDecayLR", "WarmupCosineLR"]
    params: SchedulerParams


def read_scheduler(raw: Mapping[str, Any]) -> SchedulerConfig:
    raw = _object(raw, "scheduler")
    unknown = set(raw) - {"type", "params"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"unknown key scheduler.{key}{suggest(key, ['type', 'params'])}")
    name = raw.get("type")
    if name in _UNSUPPORTED_SCHEDULERS:
        raise ConfigError(
            f"scheduler.type {name!r} is not supported yet (supported: {list(_SCHEDULERS)})"
        )
    if not isinstance(name, str) or name not in _SCHEDULERS:
        raise ConfigError(
            f"scheduler.type must be one of {list(_SCHEDULERS)}, got {name!r}"
            + suggest(str(name), list(_SCHEDULERS))
        )
    params_raw = dict(_object(raw.get("params"), "scheduler.params"))
    if "total_num_steps" not in params_raw and name != "WarmupLR":
        raise ConfigError(f"scheduler.params.total_num_steps is required for {name}")
    params: SchedulerParams = read_block(_SCHEDULERS[name], params_raw, "scheduler.params")
    return SchedulerConfig(type=name, params=params)  # type: ignore[arg-type]


@dataclass(kw_only=True, slots=True)
class ActivationCheckpointingConfig(Block):
    """``activation_checkpointing`` (takes effect where the model calls checkpointing)."""

    partition_activations: bool = False
    contiguous_memory_optimization: bool = False
    cpu_checkpointing: bool = False
    number_checkpoints: int | None = None
    synchronize_checkpoint_boundary: bool = False
    profile: bool = False

    def __post_init__(self) -> None:
        for name in (
            "partition_activations",
            "contiguous_memory_optimization",
            "cpu_checkpointing",
        ):
            if getattr(self, name):
                raise ValueError(f"activation_checkpointing.{name}=true is not supported yet")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig(Block):
    """``checkpoint``: how tags are validated across ranks when saving/loading."""

    tag_validation: Literal["Ignore", "Warn", "Fail"] = "Warn"
    load_universal: bool = False
    use_node_local_storage: bool = False

    UNSUPPORTED: ClassVar[dict[str, Any]] = {"parallel_write": REJECT_ANY}

    def __post_init__(self) -> None:
        if self.load_universal:
            raise ValueError("checkpoint.load_universal=true is not supported yet")
