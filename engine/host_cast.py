"""The offload paths' host-side copies (the fp32 -> 16-bit cast of every updated parameter), on
more than one core without touching the job's own thread count.

Why: torchrun sets ``OMP_NUM_THREADS=1`` in every rank, so ``dst.copy_(src)`` on the host runs
on one core. With the optimizer offloaded, the cast of every updated master is on the step's
critical path: one core casts roughly 1-2 GB/s of fp32, an H200's PCIe link carries 25-50 GB/s,
so the cast, not the link, sets the offload step time. ``torch.set_num_threads`` around the copy
would change the thread count the job's own CPU work runs with (it is process-wide in ATen, and
another thread of the job may run an operator meanwhile), so instead the copy is cut into
contiguous chunks, one per worker of a small pool of this module's own threads. Torch releases
the GIL inside ``copy_``, so the chunks run in parallel; each worker runs its chunk with the
job's intra-op thread count (ATen applies it to every new thread), so the total is
``workers x torch.get_num_threads()`` threads at most.

A chunk's bytes are exactly what the whole copy would write there (elementwise casts), so the
result is bytewise the single-threaded one (tests/test_host_cast.py).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

MAX_WORKERS = 8
"""At most this many casting threads (memory bandwidth stops scaling well before)."""
MIN_CHUNK_NUMEL = 1 << 20
"""No chunk smaller than this many elements: below it, handing work to a thread costs more than
the copy saves."""

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_workers = 0
_pool_pid = 0


def cast_workers() -> int:
    """Casting threads to use: the cores this process may run on (``sched_getaffinity``, which a
    launcher's CPU binding narrows), at most :data:`MAX_WORKERS`; ``ZEROSCOPE_CAST_THREADS``
    overrides (1: the plain single copy)."""
    forced = os.environ.get("ZEROSCOPE_CAST_THREADS")
    if forced:
        return max(1, int(forced))
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(MAX_WORKERS, cores))


def _executor(workers: int) -> ThreadPoolExecutor:
    """The casting threads, made on first use (and again in a forked child: a fork copies the
    pool but not its threads, and work handed to it would wait forever)."""
    global _pool, _pool_workers, _pool_pid
    with _lock:
        forked = _pool_pid != os.getpid()
        if _pool is None or _pool_workers < workers or forked:
            if _pool is not None and not forked:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(workers, thread_name_prefix="zeroscope-cast")
            _pool_workers, _pool_pid = workers, os.getpid()
        return _pool


def host_copy(dst: torch.Tensor, src: torch.Tensor, *, workers: int | None = None) -> None:
    """``dst.copy_(src)`` for two contiguous host tensors of the same number of elements, cut
    into chunks copied in parallel when the job's own thread count leaves cores idle."""
    workers = cast_workers() if workers is None else workers
    n = src.numel()
    chunks = min(workers, n // MIN_CHUNK_NUMEL)
    if (
        chunks < 2
        or torch.get_num_threads() >= workers  # ATen already spreads the copy over the cores
        or dst.device.type != "cpu"
        or src.device.type != "cpu"
        or not (dst.is_contiguous() and src.is_contiguous())
        or dst.numel() != n
    ):
        dst.copy_(src)
        return
    flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
    step = -(-n // chunks)
    spans = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    pool = _executor(workers)
    futures = [pool.submit(_copy_span, flat_dst, flat_src, lo, hi) for lo, hi in spans[1:]]
    _copy_span(flat_dst, flat_src, *spans[0])  # the calling thread takes the first chunk
    for f in futures:
        f.result()


def _copy_span(dst: torch.Tensor, src: torch.Tensor, lo: int, hi: int) -> None:
    dst[lo:hi].copy_(src[lo:hi])
