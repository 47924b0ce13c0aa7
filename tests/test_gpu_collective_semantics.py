"""Tier 4 (CUDA only): the collective-timing semantics of agent/device_collective.py, for the
attach and the bundled engine's seam, against the device's own clock (CUDA events the test
records itself around a known ``torch.cuda._sleep``) and its own allocator.

Written without a GPU; each test says why the code before this definition failed it. The
logic is driven on the CPU by stubs in tests/test_agent_device_timing.py."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests import test_agent_gpu
from zeroscope.agent.collective_record import START

pytestmark = pytest.mark.gpu

cuda_rig = test_agent_gpu.cuda_rig
"""The agent + collector fixture of tests/test_agent_gpu.py."""

CYCLES = 50_000_000


def _sleep_s() -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(CYCLES)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


@pytest.fixture
def nccl() -> Iterator[None]:
    """A one-rank NCCL group with torch's Flight Recorder and NCCL timing on (set first, as
    `zeroscope run` does), and the attach's class-level wrappers installed."""
    import torch.distributed as dist

    from zeroscope.agent.attach import collectives, patches
    from zeroscope.agent.attach.flight_recorder import configure_environment

    configure_environment()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    collectives.install()
    try:
        yield
    finally:
        patches.restore_all()
        dist.destroy_process_group()


def _resolved(ops: list[Any]) -> list[Any]:
    """The attach's records resolved as the sender would (it asks again until torch's
    watchdog has retired each work: a few tenths of a second)."""
    deadline = time.monotonic() + 10
    out = [op.resolve(ops[0]._rec[START]) for op in ops]
    while None in out and time.monotonic() < deadline:
        time.sleep(0.05)
        out = [
            o if o is not None else op.resolve(op._rec[START])
            for o, op in zip(out, ops, strict=True)
        ]
    return out


@pytest.mark.usefixtures("nccl")
def test_gpu_an_attached_synchronous_all_reduce_has_a_device_duration() -> None:
    """``dist.all_reduce(t)`` (``async_op=False``, every FSDP2 collective) under the attach: a
    device duration and the compute stream's stall. The code before gave clock ``none`` and
    exposed NA on a GPU (no event was recorded and the Flight Recorder read was the gloo one)."""
    import torch.distributed as dist

    from zeroscope.agent.attach.collectives import LOG

    LOG.take_all()
    t = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    ops = [op for op in LOG.take_all() if hasattr(op, "_rec")]
    (c,) = _resolved(ops)
    assert c is not None and c.clock == "device", c
    assert 0 < c.duration_s < 1.0 and c.exposed_measured


@pytest.mark.usefixtures("nccl")
def test_gpu_an_attached_all_reduce_hidden_behind_compute_is_short_and_not_exposed() -> None:
    """Issued async, compute queued, then waited: duration < 0.2 x the sleep, exposed < 1 ms;
    waited at once: exposed = duration within 20%. The code before timed an attached GPU op on
    the host only (clock ``none``, exposed NA): both fail."""
    import torch.distributed as dist

    from zeroscope.agent.attach.collectives import LOG

    sleep = _sleep_s()
    LOG.take_all()
    t = torch.ones(1 << 20, device="cuda")
    work = dist.all_reduce(t, async_op=True)
    torch.cuda._sleep(CYCLES)
    work.wait()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    torch.cuda.synchronize()
    ops = [op for op in LOG.take_all() if hasattr(op, "_rec")]
    hidden, at_once = _resolved(ops)
    assert hidden.clock == "device" and hidden.exposed_measured
    assert hidden.duration_s < 0.2 * sleep and hidden.exposed_s < 1e-3
    assert at_once.clock == "device" and at_once.exposed_measured
    assert at_once.exposed_s == pytest.approx(at_once.duration_s, rel=0.2, abs=2e-5)


def test_gpu_the_engines_freed_gather_buffer_is_reused_at_once(cuda_rig: tuple) -> None:
    """The bundled engine's seam holds nothing: a gather buffer freed right after its
    ``wait()`` is the next allocation of its size while the device is still busy, as with
    torch's bare Work. The code before attached a future callback per CUDA op, which
    ``recordStream``s the outputs on a pool stream: the freed block stayed parked until the
    device passed it, and the next allocation got another block (reserved memory grew)."""
    import torch.distributed as dist

    from bench.gpu_semantics import _reused
    from zeroscope.agent.attach.flight_recorder import configure_environment
    from zeroscope.engine.process_group import Comm

    tel, _ = cuda_rig
    configure_environment()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = Comm(tel=tel, rank=0, world_size=1, device=torch.device("cuda"), force=True)
        bare = _reused(comm, agent=False)
        assert _reused(comm, agent=True) == bare, "the agent parked a freed buffer"
    finally:
        dist.destroy_process_group()
