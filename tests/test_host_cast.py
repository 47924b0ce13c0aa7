"""The offload paths' host cast (engine/host_cast.py) and what a staged copy reports.

- **Bytewise the single copy**: the fp32 -> bf16/fp16 cast cut into chunks on the casting
  threads writes exactly the bytes one ``copy_`` writes (the answer: ``copy_`` on one thread),
  runs on more than one thread when the job's thread count is 1 (as torchrun sets it), and
  leaves that thread count as it was.
- **The cast is in the reported transfer**: a staged host -> device copy's duration covers its
  cast. The cast is slowed by a known sleep (the independent answer); the report must last at
  least that long. Before, the clock started after the cast and the report was the copy alone.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import torch

from zeroscope.agent.api import Telemetry
from zeroscope.engine import host_cast, offload_copy
from zeroscope.engine.offload_copy import Copier


@pytest.fixture
def one_job_thread() -> Any:
    """The job runs with one intra-op thread, as under torchrun (OMP_NUM_THREADS=1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_chunked_cast_is_bytewise_the_single_copy_and_runs_on_several_threads(
    dtype: torch.dtype, one_job_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 4 * host_cast.MIN_CHUNK_NUMEL + 12_345  # uneven: the last chunk is shorter
    src = torch.randn(n, generator=torch.Generator().manual_seed(0)) * 1e3
    src[::7] = torch.tensor(float("nan"))  # NaN, infinities and subnormals cast the same way
    src[1::11] = float("inf")
    src[2::13] = 1e-42
    threads: set[int] = set()
    spans: list[tuple[int, int]] = []
    real = host_cast._copy_span

    def seen(dst: torch.Tensor, s: torch.Tensor, lo: int, hi: int) -> None:
        threads.add(threading.get_ident())
        spans.append((lo, hi))
        real(dst, s, lo, hi)

    monkeypatch.setattr(host_cast, "_copy_span", seen)
    want = torch.empty(n, dtype=dtype)
    want.copy_(src)  # one thread: the job's own count is 1
    got = torch.empty(n, dtype=dtype)
    host_cast.host_copy(got, src, workers=4)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert sorted(spans)[0][0] == 0 and sorted(spans)[-1][1] == n and len(spans) == 4
    # The caller takes one chunk, the casting threads the others (an idle one may take two).
    assert threading.get_ident() in threads and len(threads) >= 2
    assert torch.get_num_threads() == 1  # the job's thread count is untouched


def test_small_or_already_parallel_copies_stay_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(host_cast, "_copy_span", lambda d, s, lo, hi: calls.append((lo, hi)))
    small = torch.randn(host_cast.MIN_CHUNK_NUMEL)
    out = torch.empty_like(small, dtype=torch.bfloat16)
    host_cast.host_copy(out, small, workers=4)  # one chunk's worth: no threads
    assert calls == [] and torch.equal(out, small.to(torch.bfloat16))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)  # ATen already uses 4 cores
    big = torch.randn(4 * host_cast.MIN_CHUNK_NUMEL)
    host_cast.host_copy(torch.empty_like(big), big, workers=4)
    assert calls == []


class _Transfers(Telemetry):
    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int, int]] = []

    def transfer(
        self, direction: Any, nbytes: int, start_ns: int, end_ns: int, label: str = ""
    ) -> None:
        self.seen.append((direction, nbytes, start_ns, end_ns))


def test_a_staged_copy_reports_its_cast(monkeypatch: pytest.MonkeyPatch) -> None:
    cast_s = 0.05
    real = offload_copy.host_copy

    def slow_cast(dst: torch.Tensor, src: torch.Tensor) -> None:
        if dst.dtype != src.dtype:
            time.sleep(cast_s)
        real(dst, src)

    monkeypatch.setattr(offload_copy, "host_copy", slow_cast)
    monkeypatch.setattr(offload_copy, "STAGING_NUMEL", 100)
    tel = _Transfers()
    master = torch.randn(250)
    params = torch.zeros(250, dtype=torch.bfloat16)
    Copier(tel, pin=False).copy("h2d", params, master)
    assert torch.equal(params, master.to(torch.bfloat16))
    assert [n for _, n, _, _ in tel.seen] == [200, 200, 100]  # three chunks, 16-bit bytes
    for _, _, start, end in tel.seen:
        assert end - start >= cast_s * 1e9  # each chunk's report covers its cast


@pytest.mark.gpu
def test_gpu_reported_update_lasts_the_cast_and_the_link() -> None:
    """An fp32 master (256 MiB) cast into bf16 device parameters: the engine's report must last
    at least 0.8x the host cast alone plus the link alone, timed in the same run
    (bench/gpu_offload_checks.py's row). Before, the report was the link's CUDA events only,
    a fraction of the sum whenever the cast is slower than PCIe (one core: ~1-2 GB/s)."""
    from bench.gpu_offload_checks import cast_in_bandwidth

    row = cast_in_bandwidth(torch.device("cuda"))
    assert row["verdict"] == "PASS", row


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX's")
def test_a_forked_child_casts_on_its_own_threads(one_job_thread: None) -> None:
    # A fork copies the pool object but not its threads: work handed to it would never run.
    n = 2 * host_cast.MIN_CHUNK_NUMEL
    src = torch.randn(n)
    host_cast.host_copy(torch.empty(n, dtype=torch.bfloat16), src, workers=2)  # pool made here
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if the cast completes and is right
        code = 1
        try:
            out = torch.empty(n, dtype=torch.bfloat16)
            host_cast.host_copy(out, src, workers=2)
            code = 0 if torch.equal(out, src.to(torch.bfloat16)) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:  # a hang is the failure being tested: not a race
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's cast never finished")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
