"""Stage 3's start-up placement without ``zero.Init``: the buffers go to the device now, the
parameters one at a time as they are partitioned.

``initialize`` used to move and cast the whole module first (``module.to(device, dtype)``, as
DeepSpeed's engine does) and partition it afterwards, so every rank held the full 16-bit model
on its device, and for a moment the model and the shards together: a model that fits only
sharded could not start. Here only the buffers move up front; each parameter is moved, cast,
broadcast from rank 0 and cut by the partition itself (``Partition._partition_initial_values``,
zero/stage3/partition.py: the same code that adopts ``zero.Init`` shards), its full copy freed
before the next is moved. The device then holds the shards plus one full parameter at most
(plus the persistent parameters, which stay whole by design). The values are those of the old
path bit for bit: the partition calls the same ``Tensor.to(device, dtype)`` that
``Module.to`` did.
"""

from __future__ import annotations

import torch
from torch import nn


def to_like_module_to(
    t: torch.Tensor, device: torch.device, dtype: torch.dtype | None
) -> torch.Tensor:
    """``Module.to(device, dtype)``'s conversion of one tensor: the dtype applies to floating
    and complex tensors only."""
    cast = dtype if t.is_floating_point() or t.is_complex() else None
    return t.to(device, cast)


def move_buffers(module: nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """What ``module.to(device=device, dtype=dtype)`` does to the buffers, and nothing to the
    parameters (or their gradients): stage 3's partition moves those one at a time. A module
    shared by several parents is moved once (``modules()`` yields it once)."""
    for sub in module.modules():
        for key, buf in sub._buffers.items():
            if buf is not None:
                sub._buffers[key] = to_like_module_to(buf, device, dtype)
