"""The smaller ds_config blocks: fp16, bf16, optimizer, scheduler, activation_checkpointing,
checkpoint. Names and defaults are DeepSpeed's (runtime/precision_config.py, runtime/config.py,
runtime/lr_schedules.py, runtime/activation_checkpointing/config.py, v0.19.x)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .config_parse import (
    Block,
    ConfigError,
    Ignored,
    KeyStatus,
    Notes,
    Refused,
    ignored,
    read_block,
    refused,
    suggest,
)


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

    AUTO_IS_DEFAULT: ClassVar[bool] = True
    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "auto_cast": Refused("casts the forward's floating inputs to fp16; not built", (False,)),
        "fp16_master_weights_and_grads": Refused(
            "keeps fp16 master weights instead of fp32; not built", (False,)
        ),
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
    check_grad_overflow: bool = True
    """Stages 1-2: skip a step whose gradients hold inf/NaN (DeepSpeed's ZeRO-1/2 optimizer)."""

    AUTO_IS_DEFAULT: ClassVar[bool] = True
    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "immediate_grad_update": Refused(
            "accumulates bf16 gradients into fp32 in the backward hooks; not built", (False,)
        ),
        "bf16_master_weights_and_grads": Refused(
            "keeps bf16 master weights instead of fp32; not built", (False,)
        ),
        "bf16_optimizer_states": Refused("keeps Adam's moments in bf16; not built", (False,)),
    }


@dataclass(kw_only=True, slots=True)
class AdamParams(Block):
    """``optimizer.params`` for Adam / AdamW (FusedAdam's defaults)."""

    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float | None = None
    """None: DeepSpeed's default for the optimizer it would build (see ``torch_adam``)."""
    adam_w_mode: bool = True
    """Decoupled weight decay (AdamW). DeepSpeed's ADAM_W_MODE_DEFAULT is True, so type "Adam"
    with weight_decay is AdamW-style unless adam_w_mode is false (runtime/config.py, engine.py
    _configure_basic_optimizer); type "AdamW" is AdamW-style always."""
    torch_adam: bool = False
    """DeepSpeed builds torch.optim.AdamW (AdamW mode) or Adam instead of its fused kernel: the
    same update, but torch's defaults, so an unset weight_decay is torch.optim.AdamW's 0.01
    (FusedAdam's and DeepSpeedCPUAdam's is 0)."""
    bias_correction: bool = refused(True, "Adam without bias correction is not built")

    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "amsgrad": Refused("AMSGrad is not built", (False,)),
        "set_grad_none": Ignored("FusedAdam's zero_grad detail; gradients are freed anyway"),
        "fp32_optimizer_states": Refused(
            "DeepSpeedCPUAdam's optimizer-state dtype; only fp32 states are built", (True,)
        ),
        "fused": Ignored("torch's fused Adam kernel (speed)"),
        "foreach": Ignored("torch's multi-tensor Adam kernel (speed)"),
        "capturable": Ignored("CUDA-graph capture of torch's Adam (speed)"),
        "differentiable": Refused("differentiable optimizer steps are not built", (False,)),
        "maximize": Refused("maximizing the objective is not built", (False,)),
    }

    def __post_init__(self) -> None:
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas must be in [0, 1), got {list(self.betas)}")
        if self.eps <= 0:
            raise ValueError(f"eps must be > 0, got {self.eps}")


_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}

DEEPSPEED_ONLY_OPTIMIZERS = (
    "Lamb",
    "Lion",
    "OneBitAdam",
    "OneBitLamb",
    "ZeroOneAdam",
    "MuAdam",
    "MuAdamW",
    "MuSGD",
    "Muon",
)
"""ds_config optimizer types DeepSpeed builds from its own (fused, 1-bit, muP) kernels."""


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """``optimizer``: {type, params}."""

    type: str = "AdamW"
    params: AdamParams = field(default_factory=AdamParams)
    torch_params: dict[str, Any] | None = None
    """Another torch.optim type (SGD, Adagrad, ...; DeepSpeed builds ``getattr(torch.optim,
    type)`` for a type it does not know): its params, passed to it as given."""

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


_LEGACY_FUSION = Ignored("selects DeepSpeed's older fused-optimizer wrapper (speed)")


def read_optimizer(raw: Mapping[str, Any], notes: Notes | None = None) -> OptimizerConfig:
    raw = _object(raw, "optimizer")
    unknown = set(raw) - {"type", "params", "legacy_fusion"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"unknown key optimizer.{key}{suggest(key, ['type', 'params'])}")
    if notes is not None and raw.get("legacy_fusion"):
        notes.ignored["optimizer.legacy_fusion"] = _LEGACY_FUSION.reason
    name = str(raw.get("type", "AdamW"))
    params = dict(_object(raw.get("params"), "optimizer.params"))
    if name.lower() not in _OPTIMIZERS:
        return _torch_optimizer(name, params)
    if "max_grad_norm" in params:  # DeepSpeed refuses it too
        raise ConfigError(
            "optimizer.params.max_grad_norm is not an optimizer parameter: use the top-level "
            "gradient_clipping"
        )
    config = OptimizerConfig(
        type=_OPTIMIZERS[name.lower()],
        params=read_block(AdamParams, params, "optimizer.params", notes),
    )
    p = config.params
    if p.weight_decay is None:  # runtime/engine.py get_optimizer_configuration
        p.weight_decay = 0.01 if p.torch_adam and config.decoupled_weight_decay else 0.0
    return config


def _torch_optimizer(name: str, params: dict[str, Any]) -> OptimizerConfig:
    """A type DeepSpeed takes from torch.optim; DeepSpeed's own kernels refused in one line."""
    import torch

    own = {n.lower(): n for n in DEEPSPEED_ONLY_OPTIMIZERS}
    cls = getattr(torch.optim, name, None)
    if own.get(name.lower().replace("_", "")) or not (
        isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
    ):
        ds_own = ", ".join(DEEPSPEED_ONLY_OPTIMIZERS)
        raise ConfigError(
            f"optimizer.type {name!r} is not supported: DeepSpeed's own {ds_own} are not "
            "built; Adam, AdamW and the torch.optim types (SGD, Adagrad, RMSprop, ...) are"
        )
    return OptimizerConfig(type=name, torch_params=params)


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


def read_scheduler(raw: Mapping[str, Any], notes: Notes | None = None) -> SchedulerConfig:
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
    params: SchedulerParams = read_block(_SCHEDULERS[name], params_raw, "scheduler.params", notes)
    return SchedulerConfig(type=name, params=params)  # type: ignore[arg-type]


@dataclass(kw_only=True, slots=True)
class ActivationCheckpointingConfig(Block):
    """``activation_checkpointing`` (takes effect where the model calls checkpointing)."""

    partition_activations: bool = refused(
        False, "partitioning checkpointed activations across ranks is not built"
    )
    contiguous_memory_optimization: bool = refused(
        False, "DeepSpeed's contiguous activation buffer is not built"
    )
    cpu_checkpointing: bool = refused(
        False, "moving checkpointed activations to the CPU is not built"
    )
    number_checkpoints: int | None = ignored(
        None, "sizes DeepSpeed's contiguous activation buffer, which is not built"
    )
    synchronize_checkpoint_boundary: bool = ignored(
        False, "a device synchronize at each checkpoint boundary (timing only)"
    )
    profile: bool = ignored(False, "DeepSpeed's checkpointing timers")


@dataclass(kw_only=True, slots=True)
class CheckpointConfig(Block):
    """``checkpoint``: how tags are validated across ranks when saving/loading."""

    tag_validation: Literal["Ignore", "Warn", "Fail", "ignore", "warn", "fail"] = ignored(
        "Warn", "tags are not compared across ranks: every rank saves under the same tag"
    )
    load_universal: bool = refused(False, "loading universal checkpoints is not built")
    use_node_local_storage: bool = ignored(
        False, "every rank writes its own files into the one save_dir"
    )

    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "parallel_write": Ignored("DeepSpeed's pipelined checkpoint writer (speed)"),
        "writer": Ignored("DeepSpeed's checkpoint-writer backend (speed)"),
        "checkpoint_serialization": Ignored(
            "torch.save's zip serialization; checkpoint files here are safetensors"
        ),
    }


@dataclass(kw_only=True, slots=True)
class DataTypesConfig(Block):
    """``data_types``: the dtypes DeepSpeed may use apart from the training precision. Only
    DeepSpeed's defaults are built: gradients accumulate in the training dtype."""

    KEYS: ClassVar[dict[str, KeyStatus]] = {
        "grad_accum_dtype": Refused(
            "accumulating gradients in another dtype than the training one changes the "
            "numbers; not built",
            (None,),
        ),
        "param_dtype": Refused("a parameter dtype apart from fp16/bf16 is not built", (None,)),
        "buffer_dtype": Refused("a buffer dtype apart from the module's is not built", (None,)),
        "keep_in_fp32_modules": Refused(
            "keeping chosen modules in fp32 under bf16/fp16 is not built", ("auto",)
        ),
    }
