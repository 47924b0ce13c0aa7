"""``deepspeed.checkpoint.utils``."""

from __future__ import annotations

from typing import Any

import torch

_CPU = torch.device("cpu")


def clone_tensors_for_torch_save(item: Any, device: torch.device = _CPU) -> Any:
    """DeepSpeed's helper: every tensor in ``item`` (nested lists, tuples, dicts) cloned onto
    ``device``, so ``torch.save`` writes each tensor's own elements and not the whole flat
    buffer it may be a view of."""
    if torch.is_tensor(item):
        return item.detach().clone().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item


__all__ = ["clone_tensors_for_torch_save"]
