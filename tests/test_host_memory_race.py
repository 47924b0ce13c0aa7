"""The page-locked block behind an offload buffer is read from the host allocator's global
statistics before and after the allocation; another thread pinning meanwhile (a DataLoader's
``pin_memory`` thread) must not be counted as ours.

Before, the difference was taken as it came whenever it was at least the tensor's size, so a
batch pinned by the DataLoader between the two readings was reported as offload memory. Now a
difference no block of this tensor can be (above the power of two that holds it) falls back to
the allocator's default rounding. On the CPU the allocator and its statistics are stand-ins.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from zeroscope.engine import host_memory
from zeroscope.engine.host_memory import host_empty, pinned_bytes, power_of_two_ceil


def _stand_in_allocator(monkeypatch: pytest.MonkeyPatch, readings: list[int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "host_memory_stats", lambda: {"active_bytes.current": readings.pop(0)}
    )
    empty = torch.empty

    def unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
        return empty(*args, **kwargs)  # no driver here: the bytes are plain host memory

    monkeypatch.setattr(host_memory.torch, "empty", unpinned)


def test_a_block_pinned_by_another_thread_meanwhile_is_not_ours(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    numel = 3000  # 12000 bytes in fp32: a 16 KiB block
    dataloader_batch = 64 << 20
    _stand_in_allocator(monkeypatch, [0, 16384 + dataloader_batch])
    t = host_empty(numel, torch.float32, pin=True)
    assert pinned_bytes([t]) == power_of_two_ceil(12000) == 16384


def test_a_block_the_statistics_show_exactly_is_taken_as_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _stand_in_allocator(monkeypatch, [100, 100 + 12288])  # rounded to pages, not a power of 2
    t = host_empty(3000, torch.float32, pin=True)
    assert pinned_bytes([t]) == 12288


@pytest.mark.gpu
def test_gpu_a_concurrent_pin_memory_thread_is_not_counted() -> None:
    """Before, the 64 MiB blocks the other thread pinned between the two readings were added
    to offload buffers of 12 KB."""
    import threading

    stop = threading.Event()

    def pinning() -> None:
        while not stop.is_set():
            torch.empty(16 << 20, dtype=torch.float32, pin_memory=True)

    other = threading.Thread(target=pinning, daemon=True)
    other.start()
    try:
        blocks = [pinned_bytes([host_empty(3000, torch.float32, pin=True)]) for _ in range(50)]
    finally:
        stop.set()
        other.join()
    assert all(b is not None and 12000 <= b <= 16384 for b in blocks), blocks
