"""The GPU slot's verdicts for the offload and agent-device items that had none: the NVMe pool
buffer guarded by its copy's end event, one host sync per steady step with the optimizer
offloaded, the agent's events on the Hello's device, and the host cast inside the reported
offload transfer, and an offload copy placed where the device ran it. The first three mirror their GPU-marked tests
(tests/test_nvme_pool_guard.py, test_offload_host_syncs.py, test_agent_event_device.py) on a
small model, seconds each; NA on the CPU, where none of them can go wrong (the cast's CPU test,
tests/test_host_cast.py, slows the cast by a known sleep instead).
"""

from __future__ import annotations

import tempfile
import threading
from typing import Any

from bench.gpu_checks import Verdict, guarded, verdict

SHAPE = {"vocab": 1024, "block": 64, "width": 256, "layers": 2, "heads": 4}
BATCH = 4
NVME = "NVMe optimizer store (fp32, one pool buffer) trains like no offload"
SYNCS = "optimizer offload: one host sync per steady step"
DEVICE = "agent events on the Hello's device (device='cuda:1', no set_device)"
CAST = "offload bandwidth counts the host cast (reported >= 0.8 x (cast + link))"
PLACED = "an offload copy queued behind a kernel starts where the device ran it (>= 0.8 x sleep)"
CAST_NUMEL = 64 * 2**20
"""fp32 elements of the cast check's master (256 MiB; 128 MiB of bf16 cross the link)."""


def _config(**zero: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2, **zero},
    }


def _engine(device: Any, cfg: dict[str, Any]) -> Any:
    from bench.contenders import build_model
    from zeroscope.engine.api import initialize

    engine, *_ = initialize(model=build_model(SHAPE, str(device)), config=cfg)
    return engine


def _steps(engine: Any, device: Any, steps: range) -> None:
    import torch

    for step in steps:
        g = torch.Generator().manual_seed(step)
        x = torch.randint(0, SHAPE["vocab"], (BATCH, SHAPE["block"]), generator=g).to(device)
        loss = engine(x, x)
        engine.backward(loss)
        engine.step()


def nvme_trains_like_none(device: Any) -> Verdict:
    """Adam is elementwise: the parameters after four steps must be bit-identical."""
    params = {}
    with tempfile.TemporaryDirectory(prefix="zs-slot-nvme-") as folder:
        nvme = {"device": "nvme", "nvme_path": folder, "buffer_count": 1, "pin_memory": True}
        for name, cfg in {
            "none": _config(),
            "nvme": _config(offload_optimizer=nvme, sub_group_size=4096),
        }.items():
            engine = _engine(device, cfg)
            _steps(engine, device, range(4))
            params[name] = [p.detach().cpu().clone() for p in engine.module.parameters()]
            engine.destroy()
    differ = sum(1 for a, b in zip(params["none"], params["nvme"], strict=True) if not a.equal(b))
    return verdict(NVME, differ == 0, {"parameters differing": differ})


def one_sync_per_step(device: Any) -> Verdict:
    """Event synchronizations over two steady steps: two (the gradients' flush), not four."""
    import torch

    engine = _engine(device, _config(offload_optimizer={"device": "cpu"}))
    _steps(engine, device, range(2))
    torch.cuda.synchronize()
    counts: list[int] = []
    real = torch.cuda.Event.synchronize

    loop = threading.get_ident()

    def counted(self: Any) -> None:
        if threading.get_ident() == loop:  # the training thread's, not the agent sender's
            counts.append(1)
        real(self)

    torch.cuda.Event.synchronize = counted  # type: ignore[method-assign]
    try:
        _steps(engine, device, range(2, 4))
    finally:
        torch.cuda.Event.synchronize = real  # type: ignore[method-assign]
    engine.destroy()
    return verdict(SYNCS, len(counts) == 2, {"event syncs in 2 steps": len(counts)})


def cast_in_bandwidth(device: Any) -> Verdict:
    """The engine's report of one fp32 master -> bf16 device parameter update against, in the
    same run, the host cast alone (the engine's own casting threads) and the link alone (CUDA
    events around the bf16 copy from page-locked memory). A report of the link alone, as
    before, is about the last figure; the whole update lasts about the sum."""
    import time

    import torch

    from zeroscope.agent.api import Telemetry
    from zeroscope.engine.host_cast import host_copy
    from zeroscope.engine.host_memory import host_empty
    from zeroscope.engine.offload_copy import Copier

    class Reports(Telemetry):
        def __init__(self) -> None:
            self.ns = 0

        def transfer(
            self, direction: Any, nbytes: int, start: int, end: int, label: str = "", **_: Any
        ) -> None:
            self.ns += end - start

    master = host_empty(CAST_NUMEL, torch.float32, pin=True)
    master.normal_()
    params = torch.empty(CAST_NUMEL, dtype=torch.bfloat16, device=device)
    stage = host_empty(CAST_NUMEL, torch.bfloat16, pin=True)
    reports = Reports()
    copier = Copier(reports, pin=True)
    copier.copy("h2d", params, master)  # warm: staging buffers, casting threads
    copier.flush()
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    host_copy(stage, master)
    cast_ns = time.perf_counter_ns() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    params.copy_(stage, non_blocking=True)
    end.record()
    end.synchronize()
    link_ns = int(start.elapsed_time(end) * 1e6)
    reports.ns = 0
    copier.copy("h2d", params, master)
    copier.flush()
    same = bool(torch.equal(params.cpu(), master.to(torch.bfloat16)))
    seen = {
        "cast_s": cast_ns / 1e9,
        "link_s": link_ns / 1e9,
        "reported_s": reports.ns / 1e9,
        "parameters equal the cast": same,
    }
    return verdict(CAST, same and reports.ns >= 0.8 * (cast_ns + link_ns), seen)


def copy_placed_on_device_axis(device: Any) -> Verdict:
    """A live agent on ``device``; the step queues a 200 ms kernel, then a 16 MiB host ->
    device copy through the engine's Copier, all enqueued at once: the host instant of the
    copy is ~0 s into the step, the device runs it after the kernel. The report must place
    its start at >= 0.8 x the sleep (a host start, as before, reads ~0)."""
    import torch

    from bench.gpu_semantics import SLEEP_CYCLES, _sleep_s
    from tests.test_agent_timeline import Sink
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.schema import MemoryBytes
    from zeroscope.engine.offload_copy import Copier

    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    try:
        torch.cuda.set_device(device)
        tel.bind_device(str(device))
        src = torch.empty(8 * 2**20, dtype=torch.bfloat16).pin_memory()
        dst = torch.empty_like(src, device=device)
        copier = Copier(tel, pin=True)
        sleep_s = _sleep_s(SLEEP_CYCLES)  # the kernel's own length, timed apart first
        with tel.phase("optimizer"):
            torch.cuda._sleep(SLEEP_CYCLES)
            copier.copy("h2d", dst, src)
        copier.flush()
        tel.step_end(memory=MemoryBytes())
        torch.cuda.synchronize()
        tel.step_end(memory=MemoryBytes())
        reports = sink.reports()
    finally:
        tel.close()
    starts = [t.start_s for r in reports for t in r.transfers]
    ok = len(starts) == 1 and starts[0] >= 0.8 * sleep_s
    return verdict(PLACED, ok, {"transfer starts (s)": starts, "sleep_s": sleep_s})


def offload_and_device_verdicts(device: Any) -> list[Verdict]:
    """The five rows (see the module docstring)."""
    import torch

    if device.type != "cuda":
        why = "no GPU (the CPU tests drive a device clock and stand-in streams)"
        cast = "no GPU: no link to time apart from the cast (tests/test_host_cast.py slows it)"
        return [
            verdict(NVME, None, why),
            verdict(SYNCS, None, why),
            verdict(DEVICE, None, why),
            verdict(CAST, None, cast),
            verdict(PLACED, None, why),
        ]
    two = torch.cuda.device_count() >= 2
    why = "one GPU: needs a second (tests/test_agent_event_device.py, marked gpu)"
    return [
        guarded(NVME, lambda: nvme_trains_like_none(device)),
        guarded(SYNCS, lambda: one_sync_per_step(device)),
        verdict(DEVICE, None, why if not two else "run tests/test_agent_event_device.py"),
        guarded(CAST, lambda: cast_in_bandwidth(device)),
        guarded(PLACED, lambda: copy_placed_on_device_axis(device)),
    ]
