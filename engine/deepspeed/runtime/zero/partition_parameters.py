"""``deepspeed.runtime.zero.partition_parameters``: the names DeepSpeed defines here, over the
engine's stage 3 (zero/stage3/zero_init.py, zero/stage3/gathered.py).

``zero_wrapper_for_fp_tensor_constructor`` and ``_orig_torch_arange`` exist because the Hugging
Face integration (``prevent_arange_dtype_change``) swaps the wrapper around ``zero.Init``. The
engine's ``Init`` does not patch tensor constructors, so the swap changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from zeroscope.engine.deepspeed.accelerator import get_accelerator
from zeroscope.engine.zero.stage3.gathered import (
    GatheredParameters,
    register_external_parameter,
    unregister_external_parameter,
)
from zeroscope.engine.zero.stage3.zero_init import ZeroInit as Init
from zeroscope.engine.zero.stage3.zero_init import ZeroParamStatus

_orig_torch_arange = torch.arange


def zero_wrapper_for_fp_tensor_constructor(
    fn: Callable[..., torch.Tensor], target_fp_dtype: torch.dtype, target_device: Any = None
) -> Callable[..., torch.Tensor]:
    """DeepSpeed's constructor wrapper: floating results in ``target_fp_dtype`` on
    ``target_device``. Provided for code that wraps or swaps it; ``Init`` does not use it."""

    def wrapped(*args: Any, **kwargs: Any) -> torch.Tensor:
        if target_device is not None and kwargs.get("device") is None:
            kwargs["device"] = target_device
        tensor = fn(*args, **kwargs)
        return tensor.to(target_fp_dtype) if tensor.is_floating_point() else tensor

    return wrapped


def shutdown_init_context() -> None:
    """DeepSpeed closes a still-open ``zero.Init`` here; contexts close on exit in this engine."""


__all__ = [
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "get_accelerator",
    "register_external_parameter",
    "shutdown_init_context",
    "unregister_external_parameter",
    "zero_wrapper_for_fp_tensor_constructor",
]
