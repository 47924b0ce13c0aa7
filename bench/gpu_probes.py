"""The device-level probes of bench/gpu_slot.py: which GPU this is (torch's view against NVML's),
how fast host <-> device copies are (CUDA events, against the engine's own offload timing), and
how the agent times a large all-reduce with and without compute beside it (against NCCL's own
``work._get_duration()``).

Every probe runs on the CPU too (the dry run): GPU-only figures are then None (NA) with the
reason in ``why``, and CPU copies are timed with the host clock.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

GB = 1e9


def identity() -> dict[str, Any]:
    """torch's device (name, UUID, PCI bus id) beside NVML's device found by that UUID, and the
    PCIe link's current and maximum speed and width (sysfs)."""
    from bench.gpu_check import link
    from zeroscope.agent.sampler import pci_bus_id

    if not torch.cuda.is_available():
        return {"why": "no CUDA device (dry run)"}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    out: dict[str, Any] = {
        "torch_name": props.name,
        "torch_uuid": f"GPU-{props.uuid}",
        "torch_pci": pci_bus_id(props),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByUUID(out["torch_uuid"])
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        out.update(
            nvml_name=str(pynvml.nvmlDeviceGetName(h)),
            nvml_pci=bus.lower(),
            nvml_link_gen=(
                pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            ),
            nvml_link_width=(
                pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
                pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
            ),
        )
        out["same_device"] = out["nvml_pci"].endswith(str(out["torch_pci"])[-7:])
    except Exception as exc:
        out["nvml_error"] = repr(exc)
    sysfs_bus = str(out["torch_pci"])[-12:] if out["torch_pci"] else ""
    out["link_current"] = link(sysfs_bus, "current")
    out["link_max"] = link(sysfs_bus, "max")
    return out


class Clock:
    """Times a callable on the device with CUDA events, or with the host clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def seconds(self, fn: Any, repeats: int) -> float:
        times = []
        for _ in range(repeats + 1):  # the first one warms up
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()  # the bench may synchronize; the engine does not
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int) -> dict[str, Any]:
    """GB/s of pinned and pageable H2D/D2H copies (events), and the engine's own figure for a
    16-bit parameter update from an fp32 host master (engine/offload_copy.py) beside the events'
    figure for the same bytes."""
    from zeroscope.agent.api import Telemetry
    from zeroscope.engine.offload_copy import Copier

    clock = Clock(device)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    pin = device.type == "cuda"
    out: dict[str, Any] = {"bytes": nbytes, "timed_with": "cuda events" if pin else "host clock"}
    for kind, host in (
        ("pinned", torch.empty(nbytes, dtype=torch.uint8, device="cpu", pin_memory=pin)),
        ("pageable", torch.empty(nbytes, dtype=torch.uint8, device="cpu")),
    ):
        h2d = clock.seconds(lambda d=dev, h=host: d.copy_(h, non_blocking=True), repeats)
        d2h = clock.seconds(lambda d=dev, h=host: h.copy_(d, non_blocking=True), repeats)
        out[f"{kind}_h2d_GBps"] = nbytes / h2d / GB
        out[f"{kind}_d2h_GBps"] = nbytes / d2h / GB
        if kind == "pinned" and not pin:
            out["pinned_note"] = "no CUDA: nothing is pinned, both rows are host memcpy"

    class Seen(Telemetry):
        def __init__(self) -> None:
            self.durations: list[tuple[int, float]] = []

        def transfer(
            self, direction: Any, n: int, start: int, end: int, label: str = "", **_: Any
        ) -> None:
            self.durations.append((n, (end - start) / 1e9))

    seen = Seen()
    copier = Copier(seen, pin=True)
    numel = nbytes // 2
    master = torch.randn(numel, device="cpu")
    params = torch.empty(numel, dtype=torch.bfloat16, device=device)
    per_copy = []
    for _ in range(repeats + 1):
        first = len(seen.durations)
        copier.copy("h2d", params, master)
        copier.flush()
        per_copy.append(sum(d for _, d in seen.durations[first:]))
    engine_s = statistics.median(per_copy[1:])
    out["engine_bf16_h2d_GBps"] = 2 * numel / engine_s / GB if engine_s > 0 else None
    out["engine_chunks_per_copy"] = len(seen.durations) // (repeats + 1)
    return out


def allreduce_overlap(comm: Any, device: torch.device, nbytes: int, agent: Any) -> dict[str, Any]:
    """One large all-reduce through the engine's Comm (reported to the live agent), alone and
    with compute queued beside it: the agent's duration and exposed time against the process
    group's own ``work._get_duration()`` (NCCL with TORCH_NCCL_ENABLE_TIMING=1)."""
    from zeroscope.agent.schema import MemoryBytes

    buf = torch.ones(nbytes // 4, device=device)
    rows: dict[str, Any] = {}
    for name in ("alone", "with compute"):
        handle = comm.all_reduce(buf, label=f"bench {name}")
        if name == "with compute":
            a = torch.randn(2048, 2048, device=device)
            for _ in range(20 if device.type == "cuda" else 2):
                a = a @ a
                a = a / a.norm()
        handle.wait()
        if device.type == "cuda":
            torch.cuda.synchronize()
        nccl = None
        try:
            nccl = float(handle._get_duration()) / 1e3  # ms -> s
        except Exception as exc:
            rows[f"{name} work_duration_error"] = type(exc).__name__
        agent.step_end(memory=MemoryBytes())
        rows[name] = {"work_duration_s": nccl}
    return rows
