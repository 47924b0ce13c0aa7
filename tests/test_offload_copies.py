"""The offload copies and their bandwidth figures, checked on the CPU.

- **No cast across the link.** With bf16 parameters and O on the host, the updated fp32 master
  used to be copied straight into the 16-bit device parameters: on CUDA that casts into a
  pageable temporary and copies from it synchronously, and the reported h2d bytes were the fp32
  bytes (2x what crosses PCIe). Every ``copy_`` the engine makes during an offloaded step is
  recorded here (a TorchDispatchMode): each one that writes the parameter buffer must come from
  a same-dtype staging buffer, every cast must land in that staging buffer, and the step's h2d
  bytes must be the 16-bit bytes, 2 Psi/N.
- **Chunked, double-buffered staging**: a shard larger than the staging size goes in chunks,
  one transfer each, the two buffers taking turns.
- **NVMe writes at disk speed, not page-cache speed**: after a swap write the kernel holds none
  of the file's pages in its page cache (``mincore``, the kernel's own answer; a plain write, the
  control, leaves them all resident), and the write's reported end is after its ``fsync``. A
  read leaves the cache alone unless a bandwidth measurement asks (``ZEROSCOPE_NVME_COLD_READS``).
- **PCIe nominal rate** from the link's maximum speed and width, not the idle downclocked ones.
- **Pinned bytes**: the real size of each page-locked block is what is reported.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.models import TinyGPT
from tests.offload_support import build, ds_config, padded_shard_elements, train
from zeroscope.agent.api import Telemetry, set_telemetry
from zeroscope.engine import host_memory, offload_copy
from zeroscope.engine.nvme import NvmeSwapper
from zeroscope.engine.offload_copy import Copier


class CopyLog(TorchDispatchMode):
    """Every ``aten.copy_``: (destination storage id, destination dtype, source storage id,
    source dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[int, torch.dtype, int, torch.dtype]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            self.copies.append(
                (id(dst.untyped_storage()), dst.dtype, id(src.untyped_storage()), src.dtype)
            )
        return func(*args, **(kwargs or {}))


def _bf16_offload_step(rank: int = 0, world: int = 1) -> dict[str, Any]:
    run = build(ds_config(2, "bf16", offload_optimizer={"device": "cpu"}))
    train(run, rank, world, range(1))  # the first step makes the staging buffers
    flat = id(run.engine.strategy.inner._buckets[0].flat.untyped_storage())
    with CopyLog() as log:
        train(run, rank, world, range(1, 2))
    staging = {id(b.untyped_storage()) for b in run.engine.strategy.copier.staging_buffers}
    into_params = [(s, sd) for d, dd, s, sd in log.copies if d == flat]
    casts = [d for d, dd, s, sd in log.copies if dd != sd]
    return {
        "into_params_from": [(s in staging, sd) for s, sd in into_params],
        "casts_into_staging": [d in staging for d in casts],
        "h2d": run.recorder.bytes_in_step(1, "h2d"),
        "d2h": run.recorder.bytes_in_step(1, "d2h"),
    }


def test_16bit_parameters_are_cast_on_the_host_into_staging_then_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One rank in this process (no torchrun environment): the offload path is the same at N.
    for name in ("RANK", "WORLD_SIZE", "ZEROSCOPE_WORLD1_COLLECTIVES"):
        monkeypatch.delenv(name, raising=False)
    try:
        r = _bf16_offload_step()
    finally:
        set_telemetry(None)
    shard = padded_shard_elements(TinyGPT(), 2, 1)
    assert r["into_params_from"] == [(True, torch.bfloat16)]
    assert r["casts_into_staging"] and all(r["casts_into_staging"])
    assert r["h2d"] == 2 * shard  # the bf16 bytes that cross the link
    assert r["d2h"] == 4 * shard  # fp32 gradients down


class _Transfers(Telemetry):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int, int]] = []

    def transfer(
        self, direction: Any, nbytes: int, start_ns: int, end_ns: int, label: str = ""
    ) -> None:
        self.seen.append((direction, nbytes, start_ns, end_ns))


def test_large_shards_go_in_chunks_through_two_alternating_buffers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offload_copy, "STAGING_NUMEL", 100)
    tel = _Transfers()
    copier = Copier(tel, pin=True)
    master = torch.randn(250)
    params = torch.zeros(250, dtype=torch.bfloat16)
    with CopyLog() as log:
        copier.copy("h2d", params, master)
    copier.flush()
    assert torch.equal(params, master.to(torch.bfloat16))
    assert [(d, n) for d, n, _, _ in tel.seen] == [("h2d", 200), ("h2d", 200), ("h2d", 100)]
    staging = [d for d, dd, s, sd in log.copies if dd != sd]  # where each cast went
    assert len(staging) == 3 and staging[0] != staging[1] and staging[2] == staging[0]
    assert len(copier.staging_buffers) == 2


def _resident_fraction(path: Path) -> float:
    """Share of the file's pages in the page cache, from the kernel (mmap + mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
        libc.munmap(addr, size)
        return sum(v & 1 for v in vec) / pages
    finally:
        os.close(fd)


def _filesystem(path: Path) -> str:
    best, kind = "", ""
    for line in Path("/proc/mounts").read_text().splitlines():
        _, point, fstype, *_ = line.split()
        if str(path).startswith(point) and len(point) > len(best):
            best, kind = point, fstype
    return kind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and /proc are Linux's")
def test_nvme_writes_leave_no_page_cache_behind_and_are_timed_to_the_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if _filesystem(tmp_path) in {"tmpfs", "ramfs"}:
        pytest.skip("on tmpfs the page cache is the file itself")
    data = torch.randn(1 << 20)  # 4 MiB
    control = tmp_path / "control.bin"
    control.write_bytes(data.numpy().tobytes())
    assert _resident_fraction(control) > 0.9  # the control: a plain write stays cached

    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        real_fsync(fd)
        synced.append(time.perf_counter_ns())  # when the bytes were on the disk

    monkeypatch.setattr(os, "fsync", fsync)
    swapper = NvmeSwapper(str(tmp_path), rank=0, purpose="test", tel=Telemetry())
    swapper.allocate({"u": data.numel() * 4})
    direction, nbytes, start, end, _ = swapper.write("u", data)
    assert (direction, nbytes) == ("nvme_write", 4 << 20) and len(synced) == 1
    assert start < synced[0] <= end  # the reported write ends after its fsync
    assert _resident_fraction(swapper.path("u")) < 0.1
    back = torch.empty_like(data)
    swapper.read("u", back)
    assert torch.equal(back, data)
    swapper.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and /proc are Linux's")
@pytest.mark.parametrize("cold", [False, True])
def test_nvme_reads_drop_the_page_cache_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cold: bool
) -> None:
    # A training read may be served by the page cache (stage 3 reads a shard in the forward and
    # again in the backward); only a bandwidth measurement asks every read to go to the drive.
    if _filesystem(tmp_path) in {"tmpfs", "ramfs"}:
        pytest.skip("on tmpfs the page cache is the file itself")
    from zeroscope.engine import nvme

    monkeypatch.setenv(nvme.COLD_READS_ENV, "1" if cold else "0")
    data = torch.randn(1 << 20)  # 4 MiB
    swapper = NvmeSwapper(str(tmp_path), rank=0, purpose="test", tel=Telemetry())
    swapper.allocate({"u": data.numel() * 4})
    swapper.write("u", data)
    back = torch.empty_like(data)
    swapper.read("u", back)  # the first read after a write: from the drive either way
    assert _resident_fraction(swapper.path("u")) > 0.9  # the kernel's answer: now cached
    dropped: list[int] = []
    real = nvme.drop_cached_pages
    monkeypatch.setattr(nvme, "drop_cached_pages", lambda fd: (dropped.append(fd), real(fd)))
    swapper.read("u", back)
    assert torch.equal(back, data)
    assert len(dropped) == (1 if cold else 0)
    swapper.close()


def test_nominal_pcie_rate_uses_the_maximum_link_not_the_idle_one(tmp_path: Path) -> None:
    from bench.gpu_check import link, nominal_pcie_gbps

    dev = tmp_path / "0000:65:00.0"
    dev.mkdir()
    (dev / "current_link_speed").write_text("2.5 GT/s PCIe\n")  # idle, downclocked
    (dev / "current_link_width").write_text("16\n")
    (dev / "max_link_speed").write_text("32.0 GT/s PCIe\n")  # Gen5
    (dev / "max_link_width").write_text("16\n")
    assert link("0000:65:00.0", "current", tmp_path) == (2.5, 16)
    assert nominal_pcie_gbps("0000:65:00.0", tmp_path) == pytest.approx(32 * 16 * 128 / 130 / 8)
    assert nominal_pcie_gbps("0000:66:00.0", tmp_path) is None


def test_pinned_bytes_are_the_allocator_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The page-locked block behind each buffer, from the host allocator's own statistics
    (faked here: a CPU build of torch cannot pin), or the power-of-two rule without them."""
    active = [0]

    def fake_empty(numel: int, dtype: torch.dtype, device: str, pin_memory: bool = False) -> Any:
        t = torch.zeros(numel, dtype=dtype, device=device)
        if pin_memory:  # the allocator rounds the block up to a power of two
            active[0] += host_memory.power_of_two_ceil(numel * t.element_size())
        return t

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(host_memory.torch, "empty", fake_empty)
    monkeypatch.setattr(host_memory, "_active_pinned_bytes", lambda: active[0])
    a = host_memory.host_empty(3 * 2**20 // 4, torch.float32, pin=True)  # 3 MiB -> 4 MiB
    b = host_memory.host_empty(5, torch.bfloat16, pin=True)  # 10 B -> 16 B
    c = host_memory.host_empty(10, torch.float32, pin=False)
    assert host_memory.pinned_bytes([a, a[1:], b, c]) == 4 * 2**20 + 16
    assert host_memory.pinned_bytes([c]) is None
    monkeypatch.setattr(host_memory, "_active_pinned_bytes", lambda: None)
    d = host_memory.host_empty(3, torch.float32, pin=True)
    assert host_memory.pinned_bytes([d]) == 16
