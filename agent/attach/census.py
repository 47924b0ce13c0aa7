"""Bytes an engine holds, counted from its own tensors: each distinct storage once.

Engines keep parameters, gradients and optimizer state in flat buffers with many views into
them (DeepSpeed's flat partitions, DDP's gradient buckets, FSDP2's padded shards): counting the
*storage* behind each tensor, once, gives the bytes actually held, padding included. Parts are
added in the order P, G, O, so a buffer shared between parts (a view of the parameters kept as
optimizer state) is counted where it is first met.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

PARTS = ("params", "grads", "optim")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The rank-local tensor behind a DTensor (FSDP2's sharded parameters), else ``t``."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def tensors_in(obj: Any, depth: int = 4) -> Iterable[torch.Tensor]:
    """Tensors in a (nested) list, tuple or dict: an optimizer's state, a list of groups."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_in(item, depth - 1)
    elif depth > 0 and isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_in(item, depth - 1)


class Census:
    """Per part, bytes on the compute device and bytes offloaded to the host."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int]] = set()
        self.device = dict.fromkeys(PARTS, 0)
        self.host = dict.fromkeys(PARTS, 0)

    def add(self, part: str, tensors: Iterable[Any], *, host: bool = False) -> int:
        """Count the storages of ``tensors`` (None entries skipped) under ``part``; ``host``
        says they are offloaded copies. Returns the bytes newly counted."""
        added = 0
        seen = self._seen
        for t in tensors:
            if t is None:
                continue
            t = local_tensor(t)
            if t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            key = (str(t.device), storage.data_ptr())
            if nbytes == 0 or key in seen:
                continue
            seen.add(key)
            added += nbytes
        (self.host if host else self.device)[part] += added
        return added

    def add_bytes(self, part: str, nbytes: int, *, host: bool = False) -> None:
        """Count ``nbytes`` held by storages the attach cannot reach (a C++ reducer's buckets)."""
        (self.host if host else self.device)[part] += nbytes

    def counted(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor``'s storage is already counted."""
        t = local_tensor(tensor)
        return (str(t.device), t.untyped_storage().data_ptr()) in self._seen
