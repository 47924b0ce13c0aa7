"""``deepspeed.accelerator.get_accelerator()``: the device the engine runs on (CUDA when torch has
it, else the CPU), with the calls DeepSpeed integrations make on DeepSpeed's accelerator object.
Anything else is looked up on ``torch.cuda`` (CUDA) so device utilities keep working."""

from __future__ import annotations

import os
from typing import Any

import torch


class Accelerator:
    """DeepSpeed's accelerator interface (abstract_accelerator.py), the commonly used part."""

    def __init__(self) -> None:
        self._name = "cuda" if torch.cuda.is_available() else "cpu"

    # -- devices -------------------------------------------------------------------------------

    def device_name(self, device_index: int | None = None) -> str:
        if device_index is None or self._name == "cpu":
            return self._name
        return f"{self._name}:{device_index}"

    def device(self, device_index: int | None = None) -> torch.device:
        return torch.device(self.device_name(device_index))

    def current_device(self) -> int:
        if self._name == "cuda":
            return torch.cuda.current_device()
        return int(os.environ.get("LOCAL_RANK", "0"))

    def current_device_name(self) -> str:
        if self._name == "cuda":
            return f"cuda:{torch.cuda.current_device()}"
        return "cpu"

    def set_device(self, device_index: int) -> None:
        if self._name == "cuda":
            torch.cuda.set_device(device_index)

    def device_count(self) -> int:
        return torch.cuda.device_count() if self._name == "cuda" else 1

    def is_available(self) -> bool:
        return True

    def communication_backend_name(self) -> str:
        return "nccl" if self._name == "cuda" else "gloo"

    def on_accelerator(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self._name

    def synchronize(self, device_index: int | None = None) -> None:
        if self._name == "cuda":
            torch.cuda.synchronize(device_index)

    def empty_cache(self) -> None:
        if self._name == "cuda":
            torch.cuda.empty_cache()

    # -- dtypes and RNG ------------------------------------------------------------------------

    def is_bf16_supported(self) -> bool:
        return torch.cuda.is_bf16_supported() if self._name == "cuda" else True

    def is_fp16_supported(self) -> bool:
        """DeepSpeed's CPU accelerator reports no fp16; the engine's CPU path runs it anyway."""
        return self._name == "cuda"

    def supported_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16] + ([torch.float16] if self._name == "cuda" else [])

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)
        if self._name == "cuda":
            torch.cuda.manual_seed_all(seed)

    # -- memory --------------------------------------------------------------------------------

    def memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.memory_allocated(device_index) if self._name == "cuda" else 0

    def max_memory_allocated(self, device_index: int | None = None) -> int:
        return torch.cuda.max_memory_allocated(device_index) if self._name == "cuda" else 0

    def pin_memory(self, tensor: torch.Tensor, align_bytes: int = 1) -> torch.Tensor:
        return tensor.pin_memory() if self._name == "cuda" else tensor

    def __getattr__(self, name: str) -> Any:
        if self._name == "cuda" and hasattr(torch.cuda, name):
            return getattr(torch.cuda, name)
        raise AttributeError(f"the engine's accelerator has no {name!r}")


_accelerator: Accelerator | None = None


def get_accelerator() -> Accelerator:
    global _accelerator
    if _accelerator is None:
        _accelerator = Accelerator()
    return _accelerator


def set_accelerator(accelerator: Any) -> None:
    """DeepSpeed's override hook: use ``accelerator`` from now on."""
    global _accelerator
    _accelerator = accelerator


__all__ = ["get_accelerator", "set_accelerator"]
