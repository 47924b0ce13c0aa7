"""Host buffers of the offload paths: always on ``device="cpu"`` (named, so no default device can
move them), page-locked when asked and a GPU exists, and the page-locked bytes they really hold.

Why the real bytes: torch's CUDA host allocator (ATen/core/CachingHostAllocator.h) rounds every
pinned block up to a power of two (unless ``pinned_max_round_threshold`` says otherwise), so a
12 GB optimizer shard can lock 16 GB of RAM. The tensor's own size is what the ZeRO formulas
predict; the block size is what the machine loses. Both are reported (``MemoryBytes.host_pinned``
holds the second). The block size is read from the allocator's own statistics
(``torch.cuda.host_memory_stats()["active_bytes.current"]`` before and after the allocation),
falling back to the power-of-two rule when those are unavailable or say something a block of
this tensor cannot be (another thread pinned memory meanwhile).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

import torch

_lock = threading.Lock()
_pinned_blocks: dict[int, int] = {}
"""data_ptr of a pinned buffer made here -> bytes of the block that holds it."""


def _active_pinned_bytes() -> int | None:
    try:
        return int(torch.cuda.host_memory_stats()["active_bytes.current"])
    except Exception:
        return None


def _forget(ptr: int) -> None:
    with _lock:
        _pinned_blocks.pop(ptr, None)


def power_of_two_ceil(nbytes: int) -> int:
    """The smallest power of two >= ``nbytes`` (the host allocator's default rounding)."""
    return 1 << max(nbytes - 1, 0).bit_length() if nbytes > 0 else 0


def host_empty(numel: int, dtype: torch.dtype, *, pin: bool) -> torch.Tensor:
    """A host buffer, page-locked when asked and a GPU exists (pinning needs a driver)."""
    if not (pin and torch.cuda.is_available()):
        return torch.empty(numel, dtype=dtype, device="cpu")
    before = _active_pinned_bytes()
    t = torch.empty(numel, dtype=dtype, device="cpu", pin_memory=True)
    after = _active_pinned_bytes()
    nbytes = numel * t.element_size()
    block = after - before if before is not None and after is not None else 0
    # The statistics are global: a DataLoader's pin_memory thread pinning a batch meanwhile
    # adds its block to the difference. A block of ours lies between the tensor's size and
    # the power of two above it; anything else (less: served from the cache, or no
    # statistics; more: someone else's) is the allocator's default rounding.
    if not nbytes <= block <= power_of_two_ceil(nbytes):
        block = power_of_two_ceil(nbytes)
    ptr = t.untyped_storage().data_ptr()
    with _lock:
        _pinned_blocks[ptr] = block
    weakref.finalize(t.untyped_storage(), _forget, ptr)
    return t


def pinned_bytes(tensors: Iterable[torch.Tensor]) -> int | None:
    """Page-locked bytes behind ``tensors`` (each buffer counted once); None when none of them
    is pinned."""
    seen: set[int] = set()
    total, any_pinned = 0, False
    for t in tensors:
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        with _lock:
            block = _pinned_blocks.get(ptr)
        if block is not None:
            total, any_pinned = total + block, True
    return total if any_pinned else None
