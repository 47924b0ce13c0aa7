"""Swap files for ZeRO-Infinity's NVMe offload: real files under ``nvme_path``, a small pool of
host buffers, reads ahead of need and writes behind on background threads.

DeepSpeed swaps through libaio (runtime/swap_tensor/*: ``AsyncTensorSwapper``,
``PartitionedOptimizerSwapper``); here plain ``readinto``/``write`` on one reader and one writer
thread do the same job (the GIL is released during file I/O, so they overlap the optimizer's
compute). Each swap *unit* is one file holding a few tensors back to back.

Writes at disk speed: a write is timed to the end of its ``fsync`` (the bytes are on the
device), then its pages are dropped from the page cache (``posix_fadvise(DONTNEED)``): swap files
exist because host memory is short, and the cache would otherwise fill with them. So the first
read after a write comes from the drive. (DeepSpeed reaches the same with O_DIRECT through
libaio; O_DIRECT needs block-aligned buffers, which torch tensors do not promise.)

Reads cost what they cost the job: a later read of bytes still cached (stage 3 reads a
parameter's shard in the forward and again in the backward) is served from the page cache. A
read used to drop the file's cached pages before its clock started, so that every reported read
GB/s was the drive's; that made every training read go to the disk, for an honest figure
nothing but a bandwidth measurement needs. ``ZEROSCOPE_NVME_COLD_READS=1`` (:data:`COLD_READS_ENV`)
brings it back for such a measurement (bench/offload.py sets it).

Safety, which a long run needs more than speed:

- Before anything is written the free space is checked (``shutil.disk_usage``) against the
  bytes all the files need; a missing or unwritable ``nvme_path`` fails at once. Both errors
  name the path and the bytes needed.
- Every write goes to ``<unit>.tmp`` and is renamed over the unit's file only when complete, so
  a full disk mid-write (``ENOSPC``) leaves the previous contents of the file intact.
- The folder (one per process and purpose) is removed by :meth:`NvmeSwapper.close`, by the
  garbage collector, or at interpreter exit, whichever comes first.

Threads never call the agent: each read/write returns its timing, and the caller reports it
from the training thread (:meth:`NvmeSwapper.report`).
"""

from __future__ import annotations

import errno
import itertools
import os
import queue
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from zeroscope.agent.api import Telemetry

from .host_memory import host_empty

_SEQUENCE = itertools.count()
COLD_READS_ENV = "ZEROSCOPE_NVME_COLD_READS"
"""Set to 1: every read drops the file's cached pages first (the drive's read GB/s, for a
bandwidth measurement; slower training)."""

Timing = tuple[str, int, int, int, str]
"""(direction, nbytes, start_ns, end_ns, label) of one finished file transfer."""


class NvmeError(OSError):
    """The swap folder cannot be used: one line naming the path and the bytes needed."""


def _as_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's memory as a writable byte view (no copy); ``t`` must be a contiguous CPU
    tensor."""
    return memoryview(t.view(torch.uint8).numpy())  # type: ignore[arg-type]


def drop_cached_pages(fd: int) -> None:
    """Evict the file's pages from the page cache (a no-op where posix_fadvise is missing)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        try:
            advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


class NvmeSwapper:
    """One folder of swap files under ``nvme_path`` for one rank and one purpose."""

    def __init__(self, nvme_path: str, *, rank: int, purpose: str, tel: Telemetry) -> None:
        self.root = Path(nvme_path)
        self.tel = tel
        # One folder per swapper: several engines in one process may share an nvme_path.
        self.dir = self.root / f"zeroscope-{os.getpid()}-{next(_SEQUENCE)}-rank{rank}-{purpose}"
        self.sizes: dict[str, int] = {}
        self._timings: list[Timing] = []
        self._lock = threading.Lock()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="zeroscope-nvme-read")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="zeroscope-nvme-write")
        self._finalizer: weakref.finalize | None = None
        self.cold_reads = os.environ.get(COLD_READS_ENV, "") == "1"

    # -- set-up ------------------------------------------------------------------------------

    def allocate(self, sizes: dict[str, int]) -> None:
        """Plan one file per unit (name -> bytes): create the folder after checking that the
        disk has room for all of them."""
        needed = sum(sizes.values())
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.root).free
        except OSError as exc:
            raise NvmeError(
                f"nvme_path {str(self.root)!r} is not usable ({exc.strerror or exc}); "
                f"{needed} bytes of swap files are needed there"
            ) from None
        if free < needed:
            raise NvmeError(
                f"nvme_path {str(self.root)!r} has {free} bytes free but the swap files need "
                f"{needed} bytes: free space or point nvme_path at a larger disk"
            )
        try:
            self.dir.mkdir(exist_ok=True)
            probe = self.dir / ".probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise NvmeError(
                f"nvme_path {str(self.root)!r} is not writable ({exc.strerror or exc}); "
                f"{needed} bytes of swap files are needed there"
            ) from None
        self.sizes = dict(sizes)
        self._finalizer = weakref.finalize(self, _remove_tree, self.dir)

    def path(self, unit: str) -> Path:
        return self.dir / f"{unit}.swp"

    @property
    def nbytes(self) -> int:
        """Bytes of the swap files that exist now."""
        return sum(self.sizes[u] for u in self.sizes if self.path(u).exists())

    # -- transfers ---------------------------------------------------------------------------

    def write(self, unit: str, data: torch.Tensor) -> Timing:
        """Write ``data`` (contiguous CPU) as the unit's file, atomically (tmp + rename)."""
        final = self.path(unit)
        tmp = final.with_suffix(".tmp")
        nbytes = data.numel() * data.element_size()
        start = time.perf_counter_ns()
        try:
            with open(tmp, "wb") as f:
                f.write(_as_bytes(data))
                f.flush()
                os.fsync(f.fileno())  # timed to the disk, not to the page cache
                drop_cached_pages(f.fileno())
        except OSError as exc:
            try:
                tmp.unlink()
            except OSError:
                pass
            if exc.errno == errno.ENOSPC:
                raise NvmeError(
                    errno.ENOSPC,
                    f"nvme_path {str(self.root)!r} is full: writing {nbytes} bytes to {final} "
                    f"failed (the file keeps its previous contents)",
                ) from None
            raise NvmeError(
                f"writing {nbytes} bytes to {final} failed: {exc.strerror or exc}"
            ) from None
        os.replace(tmp, final)
        return ("nvme_write", nbytes, start, time.perf_counter_ns(), unit)

    def read(self, unit: str, out: torch.Tensor, offset: int = 0) -> Timing:
        """Fill ``out`` (contiguous CPU) from the unit's file, starting ``offset`` bytes in."""
        nbytes = out.numel() * out.element_size()
        with open(self.path(unit), "rb") as f:
            if self.cold_reads:
                drop_cached_pages(f.fileno())
            start = time.perf_counter_ns()
            if offset:
                f.seek(offset)
            got = f.readinto(_as_bytes(out))
        if got != nbytes:
            raise NvmeError(f"swap file {self.path(unit)} is short: read {got} of {nbytes} bytes")
        return ("nvme_read", nbytes, start, time.perf_counter_ns(), unit)

    def read_async(self, unit: str, out: torch.Tensor) -> Future[Timing]:
        return self._reader.submit(self.read, unit, out)

    def write_async(
        self, unit: str, data: torch.Tensor, done: Callable[[], None] | None = None
    ) -> Future[Timing]:
        """Write behind; ``done`` runs on the writer thread once the file is complete (or the
        write failed), e.g. to hand the buffer back to its pool."""

        def job() -> Timing:
            try:
                return self.write(unit, data)
            finally:
                if done is not None:
                    done()

        return self._writer.submit(job)

    def record(self, timing: Timing) -> None:
        with self._lock:
            self._timings.append(timing)

    def report(self) -> None:
        """Hand the finished transfers to the agent (call from the training thread)."""
        with self._lock:
            timings, self._timings = self._timings, []
        for direction, nbytes, start, end, label in timings:
            self.tel.transfer(direction, nbytes, start, end, label)

    def close(self) -> None:
        """Stop the threads and remove the folder with every swap file."""
        self._reader.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        if self._finalizer is not None:
            self._finalizer()


class BufferPool:
    """``count`` host buffers of ``numel`` elements: the staging area of NVMe swapping. Taking
    a buffer blocks until a write-behind gives one back, which bounds host memory.

    A buffer may be given back with a *guard*: the CUDA event of a host-to-device copy that
    reads it (fp32 parameters copied from the master, page-locked, without blocking). Taking it
    again waits for that event first, so a refill never overwrites bytes the copy has yet to
    read."""

    def __init__(self, count: int, numel: int, *, dtype: torch.dtype, pin: bool) -> None:
        self.dtype, self.pin = dtype, pin
        self.buffers = [host_empty(numel, dtype, pin=pin) for _ in range(count)]
        self._guards: list[Any] = [None] * count
        self._free: queue.Queue[int] = queue.Queue()
        for i in range(count):
            self._free.put(i)

    def take(self, *, block: bool = True, numel: int = 0) -> int | None:
        """A free buffer's index (None: none free and ``block`` is False); one smaller than
        ``numel`` elements is replaced by one that large (once: it stays that size)."""
        try:
            index = self._free.get(block=block)
        except queue.Empty:
            return None
        guard, self._guards[index] = self._guards[index], None
        if guard is not None and not guard.query():
            guard.synchronize()  # the device copy still reads this buffer
        if self.buffers[index].numel() < numel:
            self.buffers[index] = host_empty(numel, self.dtype, pin=self.pin)
        return index

    def give(self, index: int, guard: Any = None) -> None:
        self._guards[index] = guard
        self._free.put(index)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)
