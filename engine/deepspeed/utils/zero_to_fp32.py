"""``deepspeed.utils.zero_to_fp32``: consolidate the engine's sharded checkpoints into one fp32
``state_dict`` (zeroscope.engine.zero_to_fp32 does the work)."""

from __future__ import annotations

from typing import Any

from zeroscope.engine.zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
)


def load_state_dict_from_zero_checkpoint(
    model: Any, checkpoint_dir: str, tag: str | None = None
) -> Any:
    """Load the consolidated fp32 weights into ``model`` (on the CPU) and return it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


__all__ = [
    "convert_zero_checkpoint_to_fp32_state_dict",
    "get_fp32_state_dict_from_zero_checkpoint",
    "load_state_dict_from_zero_checkpoint",
]
