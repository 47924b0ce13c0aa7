"""Tier 4 (CUDA only): the engine's device paths on one GPU, NCCL at world 1 through the engine's
own init (``ZEROSCOPE_WORLD1_COLLECTIVES=1``), against the allocator's own figures and CUDA
events. The CPU tiers pin the same semantics with a device canary and a storage
tracker; these say the GPU agrees.

- every stage x precision trains, with and without offload (item 1);
- memory at init: with optimizer offload the device gains only the flat 16-bit parameters
  (no fp32 master or moments, not even for a moment); stage 3 with offload never holds a second
  full copy of the model; ``save_16bit_model`` holds at most two gathered parameters (item 3);
- stage 2 with overlap_comm: the gradient peak during backward is a few buckets, not Psi (item 9);
- offload copies: a 16-bit parameter copy queued behind 50 ms of GPU work reports its own
  transfer time, not the queue's, from page-locked staging (item 8); pinned bytes are the
  allocator's blocks;
- the live agent adds no device synchronization to a steady step.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from tests.models import LinearStack, TinyGPT, batches
from tests.offload_support import ds_config
from tests.recorder import RecordingTelemetry

pytestmark = pytest.mark.gpu

MiB = 2**20


@pytest.fixture(scope="module")
def nccl_world1() -> Iterator[None]:
    """The engine initializes a one-rank NCCL group itself (no torchrun environment)."""
    import torch.distributed as dist

    saved = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k in os.environ}
    os.environ["ZEROSCOPE_WORLD1_COLLECTIVES"] = "1"
    try:
        yield
    finally:
        os.environ.pop("ZEROSCOPE_WORLD1_COLLECTIVES", None)
        os.environ.update(saved)
        if dist.is_initialized():
            dist.destroy_process_group()


def _initialize(model: nn.Module, cfg: dict[str, Any], tel: Any = None) -> Any:
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize

    set_telemetry(tel or RecordingTelemetry())
    engine, *_ = initialize(model=model, config=cfg)
    return engine


def _train(engine: Any, steps: int) -> list[float]:
    losses = []
    for x, y in batches(steps, 2, seed=3):
        loss = engine(x.cuda(), y.cuda())
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def _zero(stage: int, offload: str) -> dict[str, Any]:
    zero: dict[str, Any] = {}
    if stage == 3:
        zero = {
            "stage3_param_persistence_threshold": 0,
            "stage3_gather_16bit_weights_on_model_save": True,
        }
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload}
    return zero


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_stage_and_offload_trains_on_cuda_over_nccl(
    nccl_world1: None, precision: str
) -> None:
    results = {}
    for stage in (0, 1, 2, 3):
        for offload in ("none",) if stage == 0 else ("none", "cpu"):
            torch.manual_seed(0)
            cfg = ds_config(stage, precision, **_zero(stage, offload))
            if precision == "fp16":
                cfg["fp16"]["initial_scale_power"] = 8
            engine = _initialize(TinyGPT(), cfg)
            results[(stage, offload)] = _train(engine, 3)
    reference = results[(0, "none")]
    for key, losses in results.items():
        assert all(math.isfinite(v) for v in losses), key
        assert losses == pytest.approx(reference, rel=3e-2), key


def _big_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyGPT(vocab=4096, dim=512, heads=8, layers=4).cuda().to(torch.bfloat16)


def _device_growth(build: Any) -> tuple[int, int, Any]:
    """(peak - before, after - before) of allocated device bytes around ``build()``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = build()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, torch.cuda.memory_allocated() - before, out


def test_offloaded_optimizer_state_never_touches_the_device(nccl_world1: None) -> None:
    model = _big_model()
    psi = sum(p.numel() for p in model.parameters())
    cfg = ds_config(2, "bf16", **_zero(2, "cpu"))
    peak, _, engine = _device_growth(lambda: _initialize(model, cfg))
    # the flat 16-bit buffers are made beside the model's own parameters, then replace them
    assert peak <= 2 * psi + 4 * MiB, peak / psi
    _train_big(engine)
    assert engine.strategy.memory().grads == 0  # G freed after going to the host


def _train_big(engine: Any) -> None:
    x = torch.randint(0, 4096, (2, 8), device="cuda")
    for _ in range(2):
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()


def test_stage3_init_and_save_hold_no_second_model(nccl_world1: None, tmp_path: Any) -> None:
    model = _big_model()
    psi = sum(p.numel() for p in model.parameters())
    largest = max(p.numel() for p in model.parameters())
    cfg = ds_config(3, "bf16", **_zero(3, "cpu"))
    peak, _, engine = _device_growth(lambda: _initialize(model, cfg))
    # the 16-bit shards (2 Psi at world 1) are made beside the model, which is freed one
    # parameter at a time before the gradient shards exist; a flat copy would add 2 Psi
    assert peak <= 2 * psi + 2 * largest + 4 * MiB, peak / psi
    _train_big(engine)
    peak, _, saved = _device_growth(lambda: engine.save_16bit_model(str(tmp_path), "m.safetensors"))
    assert saved and peak <= 2 * 2 * largest + 4 * MiB, peak / largest


def test_stage2_overlap_gradient_peak_is_a_few_buckets(nccl_world1: None) -> None:
    bucket = 2048 * 2048
    cfg = ds_config(2, "fp32", overlap_comm=True, reduce_bucket_size=bucket)
    torch.manual_seed(0)
    engine = _initialize(LinearStack(2048).cuda(), cfg)
    peaks = []
    for _ in range(3):
        loss = engine(torch.randn(1, 2048, device="cuda"))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        engine.backward(loss)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - before)
        engine.step()
    # at world 1 a reduced chunk is a whole bucket: two in flight are 4 buckets' bytes (every
    # bucket alive to the end of backward would be 16)
    assert max(peaks) <= 6 * 4 * bucket, [p / (4 * bucket) for p in peaks]


class _Transfers(RecordingTelemetry):
    def __init__(self) -> None:
        super().__init__()
        self.transfers: list[tuple[str, int, int, int]] = []

    def transfer(
        self,
        direction: Any,
        nbytes: int,
        start_ns: int,
        end_ns: int,
        label: str = "",
        *,
        end_event: Any = None,
    ) -> None:
        self.transfers.append((direction, nbytes, start_ns, end_ns))


def test_offload_copies_time_the_copy_not_the_queue_and_stage_in_pinned_memory() -> None:
    from zeroscope.engine.offload_copy import Copier

    tel = _Transfers()
    copier = Copier(tel, pin=True)
    master = torch.randn(8 * MiB)  # fp32 on the host, 32 MiB
    params = torch.empty(8 * MiB, dtype=torch.bfloat16, device="cuda")
    copier.copy("h2d", params, master)  # warm-up: makes the staging buffers
    copier.flush()
    assert all(b.is_pinned() for b in copier.staging_buffers)
    tel.transfers.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(200_000_000)  # ~50-100 ms of queued GPU work
    copier.copy("h2d", params, master)
    copier.flush()
    wall = time.perf_counter() - t0
    ((direction, nbytes, start, end),) = tel.transfers
    assert (direction, nbytes) == ("h2d", 16 * MiB)
    duration = (end - start) / 1e9
    assert wall > 0.03 and duration < wall / 3, (duration, wall)
    assert torch.equal(params.cpu(), master.to(torch.bfloat16))


def test_pinned_bytes_are_what_the_host_allocator_holds() -> None:
    from zeroscope.engine.host_memory import host_empty, pinned_bytes

    before = torch.cuda.host_memory_stats()["active_bytes.current"]
    buf = host_empty(3 * MiB // 4 + 1, torch.float32, pin=True)  # 3 MiB + 4 B
    held = torch.cuda.host_memory_stats()["active_bytes.current"] - before
    assert buf.is_pinned() and held >= buf.numel() * 4
    assert pinned_bytes([buf]) == held


def _count_syncs(engine: Any, steps: int) -> list[int]:
    counts = []
    x = torch.randint(0, 37, (2, 8), device="cuda")
    for _ in range(steps):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            loss = engine(x, x)
            engine.backward(loss)
            engine.step()
        counts.append(sum("synchroniz" in str(w.message) for w in seen))
    return counts


def test_the_live_agent_adds_no_device_synchronization(nccl_world1: None) -> None:
    from tests.distributed import connected_publisher
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.collector.server import Collector

    cfg = ds_config(2, "bf16")
    torch.manual_seed(0)
    plain = _initialize(TinyGPT().cuda(), cfg)
    with Collector() as col:
        agent = LiveTelemetry(connected_publisher(col.ingest_address), job_id="sync")
        torch.manual_seed(0)
        watched = _initialize(TinyGPT().cuda(), cfg, tel=agent)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            without, with_agent = _count_syncs(plain, 4)[2:], _count_syncs(watched, 4)[2:]
        finally:
            torch.cuda.set_sync_debug_mode(0)
            agent.close()
    assert with_agent == without, (with_agent, without)
