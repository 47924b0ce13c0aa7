"""``deepspeed.checkpoint``: ``utils.clone_tensors_for_torch_save``."""

from __future__ import annotations

from . import utils

__all__ = ["utils"]
