"""GPU rows the CPU bench cannot measure: the engine over NCCL beside DDP and FSDP2, and
pinned-memory PCIe bandwidth (host->device, device->host) against the link's nominal rate.

    python -m bench.gpu_check            # or: python -m bench --only gpu
    python -m bench.gpu_check --quick

Without CUDA it says so and exits 0 (the table row reads "not measured"). Ranks: min(2, GPUs);
on one GPU the engine rows run at 1 rank (no communication: they compare compute paths only).
Bandwidth: 256 MiB pinned host buffer <-> device, timed with CUDA events, median of repeats;
nominal = link GT/s x lanes x 128/130 / 8 from /sys (PCIe gen3+ encoding), per direction, from
the link's *maximum* speed and width: an idle GPU downclocks its link (current_link_speed can
read 2.5 GT/s on a Gen5 x16 slot), so the current figures say nothing about what it can carry.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Table  # noqa: E402

PCI_DEVICES = Path("/sys/bus/pci/devices")


def link(pci_bus: str, which: str = "max", root: Path = PCI_DEVICES) -> tuple[float, int] | None:
    """(GT/s, lanes) of the device's PCIe link from sysfs, ``which`` = "max" or "current";
    None if unknown."""
    dev = root / pci_bus.lower()
    try:
        speed = float((dev / f"{which}_link_speed").read_text().split()[0])  # "32.0 GT/s PCIe"
        width = int((dev / f"{which}_link_width").read_text().strip())
    except (OSError, ValueError, IndexError):
        return None
    return speed, width


def nominal_pcie_gbps(pci_bus: str, root: Path = PCI_DEVICES) -> float | None:
    """Per-direction nominal GB/s of the device's PCIe link at its maximum speed and width
    (not the current, possibly idle-downclocked, ones); None if unknown."""
    found = link(pci_bus, "max", root)
    if found is None:
        return None
    speed, width = found
    return speed * width * 128 / 130 / 8


def pcie_bandwidth(repeats: int) -> dict[str, Any]:
    import torch

    nbytes = 256 * 2**20
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out: dict[str, Any] = {}
    for name, dst, src in (("h2d", device, host), ("d2h", host, device)):
        times = []
        for _ in range(repeats + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        out[name] = nbytes / statistics.median(times[1:]) / 1e9
    p = torch.cuda.get_device_properties(0)
    ids = [getattr(p, f"pci_{k}_id", 0) for k in ("domain", "bus", "device")]
    bus = f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}.0"
    out["nominal"] = nominal_pcie_gbps(bus)
    out["bus"] = bus
    return out


def run(*, quick: bool) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"skipped": "torch is not installed"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device on this machine"}
    from bench.engine_compare import run as engine_run

    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0)}
    result["pcie"] = pcie_bandwidth(5 if quick else 20)
    world = min(2, torch.cuda.device_count())
    shape = {
        "vocab": 8192,
        "block": 256,
        "width": 512,
        "layers": 8,
        "heads": 8,
        "batch": 8,
        "device": "cuda",
    }
    result["engine"] = engine_run(
        f"Engine on {result['device']} ({world} rank(s), NCCL)",
        shape,
        {"torch", "zeroscope"},
        rounds=3 if quick else 8,
        steps=2 if quick else 5,
        world=world,
        only_stages={"0", "1", "2", "3"},
    )
    return result


def table(result: dict[str, Any]) -> list[Table]:
    t = Table(title="GPU: PCIe and NCCL", columns=["what", "measured", "nominal", "ratio"])
    if "skipped" in result:
        t.add("GPU / NCCL / PCIe rows", f"not measured: {result['skipped']}", None, None)
        t.note = "Run `python -m bench.gpu_check` on a CUDA machine to fill these rows."
        return [t]
    pcie = result["pcie"]
    for d in ("h2d", "d2h"):
        ratio = None if pcie["nominal"] is None else pcie[d] / pcie["nominal"]
        t.add(f"pinned {d.upper()} GB/s ({pcie['bus']})", pcie[d], pcie["nominal"], ratio)
    return [t, result["engine"]]


def main(argv: list[str] | None = None) -> int:
    from bench.harness import render_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    for t in table(run(quick=args.quick)):
        print(render_table(t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
