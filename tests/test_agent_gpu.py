"""Tier 4 (CUDA only): the agent's device paths: allocator figures beside A, loss read from a
device tensor without a sync, and collective timing by CUDA events on a one-rank NCCL group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from tests.distributed import connected_publisher
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.schema import (
    ConfigSummary,
    MemoryBytes,
    Message,
    ParamCounts,
    StepReport,
)
from zeroscope.collector.server import Collector, wait_for

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_rig() -> Iterator[tuple[LiveTelemetry, list[Message]]]:
    got: list[Message] = []
    col = Collector()
    col.add_listener(got.append)
    with col:
        tel = LiveTelemetry(connected_publisher(col.ingest_address), job_id="gpu")
        tel.hello(
            config=ConfigSummary(stage=0, precision="fp32", dp_world_size=1),
            params=ParamCounts(total=1, trainable=1),
            device="cuda:0",
        )
        yield tel, got
        tel.close()
        assert wait_for(lambda: any(type(m).__name__ == "Bye" for m in got))


def test_cuda_step_reports_allocator_and_lazy_loss(
    cuda_rig: tuple[LiveTelemetry, list[Message]],
) -> None:
    tel, got = cuda_rig
    B, d, h = 8, 16, 32
    model = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, 1)).cuda()
    x, y = torch.randn(B, d, device="cuda"), torch.randn(B, 1, device="cuda")
    losses = []
    for _ in range(3):
        with tel.phase("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with tel.phase("backward"):
            loss.backward()
        tel.step_end(memory=MemoryBytes(params=1), loss=loss.detach(), grad_norm=loss.detach())
        losses.append(loss.item())
    tel.close()  # resolves what is still pending
    assert wait_for(lambda: sum(isinstance(m, StepReport) for m in got) == 3)
    reps = [m for m in got if isinstance(m, StepReport)]
    assert [r.loss for r in reps] == pytest.approx(losses)
    for r in reps:
        assert r.memory.activations == 4 * (B * d + B * h + B + B)
        assert r.memory.device_allocated and r.memory.device_reserved and r.memory.device_peak
        assert r.memory.device_reserved >= r.memory.device_allocated


def test_nccl_collective_timed_by_cuda_events(
    cuda_rig: tuple[LiveTelemetry, list[Message]],
) -> None:
    import torch.distributed as dist

    tel, got = cuda_rig
    store = dist.HashStore()
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        t = torch.ones(1 << 20, device="cuda")
        handle = tel.collective(
            dist.all_reduce(t, async_op=True), op="all_reduce", nbytes=t.numel() * 4, group_size=1
        )
        # Compute that overlaps, timed by the test's own events: the all-reduce (issued first,
        # 4 MB at world 1) is over long before this ends, so waiting for it afterwards exposes
        # next to nothing of it.
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        torch.cuda._sleep(1_000_000)
        after.record()
        handle.wait()
        torch.cuda.synchronize()  # the test's own sync, so the events are complete
        tel.step_end(memory=MemoryBytes())
    finally:
        dist.destroy_process_group()
    assert wait_for(lambda: any(isinstance(m, StepReport) for m in got))
    (r,) = [m for m in got if isinstance(m, StepReport)]
    (c,) = r.collectives
    assert c.nbytes == 4 << 20 and c.duration_s > 0
    # Against the independent clock (not the agent's clamp exposed <= duration): counting the
    # overlapped compute as waiting would make exposed at least the sleep's length.
    overlapped_s = before.elapsed_time(after) / 1e3
    assert overlapped_s > 0 and 0 <= c.exposed_s < 0.5 * overlapped_s
