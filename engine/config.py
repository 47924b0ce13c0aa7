"""ds_config.json -> :class:`DeepSpeedConfig`, with DeepSpeed's key names and defaults.

Reading order: hjson (accepts ``//`` comments, as real-world ds_config files carry them) ->
``"auto"`` filled from the caller's ``auto_values`` -> every block read by
:func:`~.config_parse.read_block` (unknown keys name the closest known key; known-but-unsupported
keys are refused as such) -> batch sizes resolved against the data-parallel world size, as
DeepSpeed's ``_set_batch_related_parameters`` does.

Deliberate differences from DeepSpeed 0.19 (zero-facts §4): ``"auto"`` left unfilled is an error
naming the key (DeepSpeed drops it in blocks and crashes at top level); ``offload_param`` below
stage 3 is refused (DeepSpeed accepts and ignores it). Kept on purpose: an absent
``gradient_clipping`` means 1.0 (runtime/constants.py GRADIENT_CLIPPING_DEFAULT), so a ported
config trains identically.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .config_blocks import (
    ActivationCheckpointingConfig,
    BF16Config,
    CheckpointConfig,
    DataTypesConfig,
    FP16Config,
    OptimizerConfig,
    SchedulerConfig,
    read_optimizer,
    read_scheduler,
)
from .config_keys import TOP_LEVEL_KEYS
from .config_parse import Block, ConfigError, KeyStatus, Notes, fill_auto, read_block
from .config_zero import AioConfig, ZeroConfig

__all__ = [
    "GRADIENT_CLIPPING_DEFAULT",
    "ConfigError",
    "DeepSpeedConfig",
    "load_config",
    "read_raw",
    "report_ignored",
]

log = logging.getLogger("zeroscope.engine")

GRADIENT_CLIPPING_DEFAULT = 1.0
"""DeepSpeed's runtime/constants.py: an absent gradient_clipping clips at 1.0."""


@dataclass(kw_only=True, slots=True)
class DeepSpeedConfig(Block):
    """The whole ds_config, typed. Batch sizes are resolved (never None) after :func:`load_config`."""

    train_batch_size: int | None = None
    """Samples per optimizer step over all ranks = micro x accumulation x data-parallel size."""
    train_micro_batch_size_per_gpu: int | None = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float = GRADIENT_CLIPPING_DEFAULT
    """Global L2 norm clip (0 = off)."""
    steps_per_print: float = 10
    """Rank 0 logs loss/lr/scale every this many optimizer steps (Python logging, INFO); 0 or
    ``Infinity`` (what accelerate writes) never."""
    dataloader_drop_last: bool = False
    """The loader ``initialize(training_data=...)`` returns drops the last partial batch."""
    zero_allow_untested_optimizer: bool = False
    zero_force_ds_cpu_optimizer: bool = True
    fp16: FP16Config = field(default_factory=FP16Config)
    bf16: BF16Config = field(default_factory=BF16Config)
    zero_optimization: ZeroConfig = field(default_factory=ZeroConfig)
    aio: AioConfig = field(default_factory=AioConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    data_types: DataTypesConfig = field(default_factory=DataTypesConfig)
    optimizer: OptimizerConfig | None = None
    scheduler: SchedulerConfig | None = None
    notes: Notes = field(default_factory=Notes, metadata={"not_a_key": True})
    """What reading found worth saying once (ignored keys); see :func:`report_ignored`."""

    ALIASES: ClassVar[dict[str, str]] = {"bfloat16": "bf16"}
    KEYS: ClassVar[dict[str, KeyStatus]] = TOP_LEVEL_KEYS

    def __post_init__(self) -> None:
        if self.fp16.enabled and self.bf16.enabled:
            raise ValueError("fp16 and bf16 cannot both be enabled")
        if self.steps_per_print < 0:
            raise ValueError(f"steps_per_print must be >= 0, got {self.steps_per_print}")
        if self.gradient_clipping < 0:
            raise ValueError(f"gradient_clipping must be >= 0, got {self.gradient_clipping}")
        for name in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

    @property
    def precision(self) -> str:
        """fp32 | bf16 | fp16 (the wire schema's Precision)."""
        return "fp16" if self.fp16.enabled else "bf16" if self.bf16.enabled else "fp32"

    @property
    def micro_batch(self) -> int:
        assert self.train_micro_batch_size_per_gpu is not None, "batch sizes not resolved"
        return self.train_micro_batch_size_per_gpu

    @property
    def accumulation_steps(self) -> int:
        assert self.gradient_accumulation_steps is not None, "batch sizes not resolved"
        return self.gradient_accumulation_steps


def resolve_batch_sizes(cfg: DeepSpeedConfig, dp_world_size: int) -> None:
    """Any two of the three batch keys give the third; one alone implies accumulation 1;
    all three must agree (DeepSpeed runtime/config.py ``_set_batch_related_parameters``)."""
    tb, mb, gas = (
        cfg.train_batch_size,
        cfg.train_micro_batch_size_per_gpu,
        cfg.gradient_accumulation_steps,
    )
    n = dp_world_size
    if tb is None and mb is None:
        raise ConfigError("either train_batch_size or train_micro_batch_size_per_gpu must be given")
    if tb is not None and mb is not None and gas is None:
        gas = max(1, tb // (mb * n))
    elif tb is not None and gas is not None and mb is None:
        mb = max(1, tb // (n * gas))
    elif mb is not None and tb is None:
        gas = gas or 1
        tb = mb * gas * n
    elif tb is not None and mb is None:
        gas = 1
        mb = max(1, tb // n)
    assert tb is not None and mb is not None and gas is not None
    if tb != mb * gas * n:
        raise ConfigError(
            f"train_batch_size {tb} != train_micro_batch_size_per_gpu {mb} x "
            f"gradient_accumulation_steps {gas} x data-parallel size {n} (= {mb * gas * n})"
        )
    cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu = tb, mb
    cfg.gradient_accumulation_steps = gas


def read_raw(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """The raw dict of a ds_config given as a path, a JSON/hjson string, or a mapping."""
    if isinstance(source, Mapping):
        return dict(source)
    text: str
    path = Path(source)
    if isinstance(source, str) and source.lstrip().startswith("{"):
        text = source
    else:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read ds_config {str(source)!r}: {exc.strerror}") from None
    import hjson  # imported here: only config reading needs it

    try:
        raw = hjson.loads(text)
    except (hjson.HjsonDecodeError, ValueError) as exc:
        raise ConfigError(
            f"ds_config {str(source)[:80]!r} is not valid JSON/hjson: {exc}"
        ) from None
    if not isinstance(raw, Mapping):
        raise ConfigError("ds_config must be a JSON object {...}")
    return json.loads(json.dumps(raw))  # plain dicts (hjson gives OrderedDicts)


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    dp_world_size: int,
    auto_values: Mapping[str, Any] | None = None,
) -> DeepSpeedConfig:
    """Read, validate and resolve a ds_config for ``dp_world_size`` data-parallel ranks.

    ``auto_values`` fills ``"auto"`` entries by dotted key, e.g.
    ``{"train_micro_batch_size_per_gpu": 8, "optimizer.params.lr": 3e-4}``."""
    cfg = read_config(source, auto_values=auto_values)
    resolve_batch_sizes(cfg, dp_world_size)
    check_implemented(cfg)
    return cfg


def read_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    auto_values: Mapping[str, Any] | None = None,
) -> DeepSpeedConfig:
    """Read and validate a ds_config without resolving batch sizes (``zero.Init`` reads the
    precision and stage of a config whose batch keys may still be "auto")."""
    raw = fill_auto(read_raw(source), auto_values or {})
    notes = Notes()
    blocks = {"optimizer": read_optimizer, "scheduler": read_scheduler}
    special = {k: blocks[k](v, notes) for k, v in raw.items() if k in blocks and v is not None}
    rest = {k: v for k, v in raw.items() if k not in blocks}
    cfg = read_block(DeepSpeedConfig, rest, notes=notes)
    cfg.optimizer = special.get("optimizer")  # type: ignore[assignment]
    cfg.scheduler = special.get("scheduler")  # type: ignore[assignment]
    cfg.notes = notes
    return cfg


def check_implemented(cfg: DeepSpeedConfig) -> None:
    """Refuse what parses but is not built yet, with a clear reason (never silently ignore)."""
    offload = cfg.zero_optimization.offload_optimizer
    if offload.device != "none" and offload.ratio != 1.0:
        raise ConfigError(
            f"zero_optimization.offload_optimizer.ratio={offload.ratio} is not supported yet "
            f"(the whole optimizer step runs where O lives; use 1.0)"
        )


_reported: set[str] = set()


def report_ignored(cfg: DeepSpeedConfig, *, rank: int) -> list[str]:
    """Log, on rank 0 and once per process for each key, the keys accepted without effect and
    why; returns the lines logged."""
    lines = [
        f"ds_config {key}: accepted and ignored ({reason})"
        for key, reason in sorted(cfg.notes.ignored.items())
        if key not in _reported
    ]
    _reported.update(cfg.notes.ignored)
    if rank == 0:
        for line in lines:
            log.warning(line)
    return lines
