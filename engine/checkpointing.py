"""Activation checkpointing, as ``deepspeed.checkpointing`` spells it::

    from zeroscope.engine import checkpointing
    checkpointing.configure(None, deepspeed_config="ds_config.json")   # optional
    x = checkpointing.checkpoint(block, x)                              # in the model's forward

A checkpointed call keeps only its inputs for backward; its inner activations are recomputed
when backward needs them (zero-facts §1: about one extra forward for roughly sqrt(layers)
activation memory). It is ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``: the RNG
state is replayed, so dropout draws the same masks and the results are identical to the run
without checkpointing; keyword arguments and outputs that need no gradient work.

With ZeRO stage 3 the recomputation runs the checkpointed modules' forward hooks again, so their
parameters are gathered again for it (the stage-3 coordinator records this in its trace like any
other fetch): checkpointing trades activation memory for compute *and* all-gather traffic.

Of the ``activation_checkpointing`` block, ``partition_activations``,
``contiguous_memory_optimization`` and ``cpu_checkpointing`` are refused by the config reader
(not built); ``number_checkpoints``, ``synchronize_checkpoint_boundary`` and ``profile`` are
accepted and have no effect here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import torch.utils.checkpoint

from .config_blocks import ActivationCheckpointingConfig

_config: ActivationCheckpointingConfig | None = None


def configure(
    mpu_: Any = None,
    deepspeed_config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    partition_activations: bool | None = None,
    contiguous_checkpointing: bool | None = None,
    num_checkpoints: int | None = None,
    checkpoint_in_cpu: bool | None = None,
    synchronize: bool | None = None,
    profile: bool | None = None,
) -> ActivationCheckpointingConfig:
    """DeepSpeed's ``configure``: read the ``activation_checkpointing`` block of a ds_config
    (path, JSON string or dict) and apply the keyword overrides. Unsupported options raise a
    one-line ValueError."""
    if mpu_ is not None:
        raise ValueError("model parallelism (mpu) is not supported by activation checkpointing")
    raw: dict[str, Any] = {}
    if deepspeed_config is not None:
        from .config import read_raw

        raw = dict(read_raw(deepspeed_config).get("activation_checkpointing") or {})
    overrides = {
        "partition_activations": partition_activations,
        "contiguous_memory_optimization": contiguous_checkpointing,
        "number_checkpoints": num_checkpoints,
        "cpu_checkpointing": checkpoint_in_cpu,
        "synchronize_checkpoint_boundary": synchronize,
        "profile": profile,
    }
    raw.update({k: v for k, v in overrides.items() if v is not None})
    from .config_parse import read_block

    global _config
    _config = read_block(ActivationCheckpointingConfig, raw, "activation_checkpointing")
    return _config


def is_configured() -> bool:
    """True once :func:`configure` ran (DeepSpeed's name)."""
    return _config is not None


def checkpoint(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)`` without keeping its inner activations for backward;
    they are recomputed in backward (see the module docstring)."""
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=False, **kwargs)


non_reentrant_checkpoint = checkpoint
"""DeepSpeed has both names; here both are the non-reentrant one."""


def reset() -> None:
    """DeepSpeed's per-iteration reset: nothing is buffered here."""
