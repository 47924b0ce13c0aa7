"""Partition math shared by ZeRO stages 1, 2 and 3 (and CPU offload).

A group of parameters is laid out end to end in one flat buffer, padded at the end to a
multiple of the data-parallel size N, and cut into N equal shards: rank r owns elements
``[r * S, (r + 1) * S)`` with ``S = padded / N``. Equal shards are what makes a real
``reduce_scatter`` / ``all_gather_into_tensor`` possible (NCCL and gloo need equal chunks);
the padding (< N elements per group) is zeros and is counted in the memory figures.

Nothing here touches torch.distributed; it is pure arithmetic plus two tensor helpers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def padded_size(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of ``world_size``."""
    return -(-numel // world_size) * world_size


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """Where each parameter of a group sits in the group's flat buffer, and who owns what."""

    numels: tuple[int, ...]
    """Elements of each parameter, in flat order."""
    offsets: tuple[int, ...]
    """Start of each parameter in the flat buffer."""
    world_size: int

    @property
    def numel(self) -> int:
        """Real elements (no padding)."""
        return self.offsets[-1] + self.numels[-1] if self.numels else 0

    @property
    def padded_numel(self) -> int:
        return padded_size(self.numel, self.world_size)

    @property
    def shard_numel(self) -> int:
        """Elements each rank owns (padding included on the last ranks)."""
        return self.padded_numel // self.world_size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """Rank's ``[start, end)`` in the flat buffer."""
        s = self.shard_numel
        return rank * s, (rank + 1) * s

    def param_in_shard(self, index: int, rank: int) -> tuple[int, int] | None:
        """The part of parameter ``index`` that rank owns, as ``[start, end)`` offsets inside
        the parameter's own flattened elements, or None if the rank owns none of it."""
        lo, hi = self.shard_range(rank)
        start = max(lo, self.offsets[index])
        end = min(hi, self.offsets[index] + self.numels[index])
        if start >= end:
            return None
        return start - self.offsets[index], end - self.offsets[index]


def make_layout(numels: Sequence[int], world_size: int) -> FlatLayout:
    """Lay out parameters of ``numels`` elements end to end for ``world_size`` ranks."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    offsets, at = [], 0
    for n in numels:
        offsets.append(at)
        at += int(n)
    return FlatLayout(
        numels=tuple(int(n) for n in numels), offsets=tuple(offsets), world_size=world_size
    )


def split_buckets(numels: Sequence[int], bucket_size: int) -> list[list[int]]:
    """Consecutive runs of parameter indices whose sizes add up to at most ``bucket_size``
    elements (a parameter larger than a bucket gets a bucket of its own), as DeepSpeed's
    reduce_bucket_size bounds its ``ipg`` buckets."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for i, n in enumerate(numels):
        if current and filled + n > bucket_size:
            buckets.append(current)
            current, filled = [], 0
        current.append(i)
        filled += n
    if current:
        buckets.append(current)
    return buckets


def flatten_into(
    tensors: Sequence[torch.Tensor], layout: FlatLayout, *, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A new zero-padded flat buffer holding ``tensors`` (cast to ``dtype``) at their offsets."""
    flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
    for t, off, n in zip(tensors, layout.offsets, layout.numels):
        flat[off : off + n].copy_(t.detach().reshape(-1))
    return flat


def views_of(
    flat: torch.Tensor, layout: FlatLayout, shapes: Sequence[torch.Size]
) -> list[torch.Tensor]:
    """Views into ``flat`` shaped like the parameters (writes through both ways)."""
    return [
        flat[off : off + n].view(shape)
        for off, n, shape in zip(layout.offsets, layout.numels, shapes)
    ]
