"""The device's peak FLOP/s, the denominator of MFU: from the datasheet for a GPU zeroscope
knows, and measured by a short matmul for any other device (CPU included).

MFU (model FLOPs utilization, PaLM, Chowdhery et al. 2022, appendix B) divides the model's
FLOPs per second by the hardware's peak. The datasheet peak is the dense one (NVIDIA prints
"with sparsity" figures twice as high; those are not reachable by a dense model). A measured
peak is what a square matmul of the job's dtype reaches here: a ceiling real code can touch,
so MFU is meaningful on a CPU too. ``Work.peak_source`` says which one was used.

The measurement runs on a thread of its own when the model's first forward is seen (never on
the training thread) and uses its own tensors (``torch.ones``, no random generator: the job's
RNG stream is untouched). It runs on the host only: a GPU the datasheet table does not know is
never probed, because the probe's matrices would stay in the caching allocator (the job's
``memory_reserved`` changed) and its kernels would share the device with training; MFU is NA
there with the reason, unless ``ZEROSCOPE_PEAK_TFLOPS`` gives the dense peak by hand (which
also overrides the table and the probe anywhere). ``ZEROSCOPE_PEAK_PROBE=0`` skips the host
probe.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

PEAK_PROBE_ENV = "ZEROSCOPE_PEAK_PROBE"
PEAK_TFLOPS_ENV = "ZEROSCOPE_PEAK_TFLOPS"

# Dense (no structured sparsity) peak TFLOP/s per GPU, from NVIDIA's datasheets:
# H100/H200: "NVIDIA H100 Tensor Core GPU" datasheet (SXM: BF16/FP16 1,979 with sparsity ->
#   989.4 dense, TF32 494.7 dense, FP32 67; PCIe: 1,513 -> 756, TF32 378, FP32 51; NVL: 1,671
#   -> 835.5, TF32 417.5, FP32 60) and the "NVIDIA H200 Tensor Core GPU" datasheet (SXM: the
#   H100 SXM's compute).
# A100: "NVIDIA A100 Tensor Core GPU" datasheet (BF16/FP16 312, TF32 156, FP32 19.5).
# L40S: datasheet (BF16 362.05 dense, TF32 183, FP32 91.6); L4: datasheet (BF16 121, TF32 60,
#   FP32 30.3); A10: datasheet (BF16 125, TF32 62.5, FP32 31.2).
# V100 SXM2: "NVIDIA Tesla V100" datasheet (FP16 tensor 125, FP32 15.7; no BF16 or TF32).
# B200: "NVIDIA DGX B200" datasheet, per GPU (BF16/FP16 2,250 dense, TF32 1,100, FP32 75).
# Order matters: the first name found in the device name wins ("H100 NVL" before "H100").
DATASHEET_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0, "fp32": 75.0}),
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
)


def datasheet_peak(device_name: str, precision: str) -> tuple[float, str] | None:
    """(FLOP/s, source) of the dense peak for ``precision`` (bf16, fp16, tf32, fp32) on the GPU
    named ``device_name`` (``torch.cuda.get_device_name()``); None when not in the table."""
    name = device_name.replace("-", " ")
    for key, peaks in DATASHEET_TFLOPS:
        if key.lower() in name.lower():
            tflops = peaks.get(precision)
            if tflops is None:
                return None
            return tflops * 1e12, f"datasheet {key} {precision} dense"
    return None


def measure_matmul(
    torch: Any,
    device: Any,
    dtype: Any,
    size: int,
    seconds: float = 0.25,
    stop: threading.Event | None = None,
) -> float | None:
    """The best FLOP/s of ``size x size`` matmuls in ``dtype`` on ``device`` over about
    ``seconds`` (2·n³ FLOPs each); None when it cannot run there, or when ``stop`` was set
    before the ``seconds`` were up (a partial best could be far below the peak)."""
    stop = stop or threading.Event()
    try:
        a = torch.ones((size, size), device=device, dtype=dtype)
        b = torch.ones((size, size), device=device, dtype=dtype)
        out = torch.empty((size, size), device=device, dtype=dtype)
        flops = 2.0 * size**3
        best = 0.0
        if device.type == "cuda":
            stream = torch.cuda.Stream(device)
            with torch.cuda.stream(stream):
                torch.mm(a, b, out=out)  # warm-up (kernel selection)
                deadline = time.perf_counter() + seconds
                while time.perf_counter() < deadline and not stop.is_set():
                    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
                    start.record(stream)
                    for _ in range(8):
                        torch.mm(a, b, out=out)
                    end.record(stream)
                    end.synchronize()  # this thread waits; the training thread does not
                    best = max(best, 8 * flops / (start.elapsed_time(end) / 1e3))
        else:
            torch.mm(a, b, out=out)
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline and not stop.is_set():
                t0 = time.perf_counter()
                torch.mm(a, b, out=out)
                best = max(best, flops / max(time.perf_counter() - t0, 1e-9))
        return None if stop.is_set() else best or None
    except Exception:
        return None


class PeakProbe:
    """The peak MFU divides by, found once per process: the datasheet's for a known GPU, else
    measured on a thread of its own. ``figure()`` is (FLOP/s or None, source or why not)."""

    PROBE_S = 0.25
    """How long each dtype's matmuls run."""

    def __init__(self) -> None:
        self._peak: float | None = None
        self._source = "peak not known yet"
        self._started = False
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        """The measuring thread, once started."""

    def start(self, torch: Any, device: Any, precision: str) -> None:
        """Find the peak for ``precision`` on ``device`` (once; returns at once)."""
        if self._started:
            return
        self._started = True
        given = os.environ.get(PEAK_TFLOPS_ENV, "")
        if given:
            try:
                self._peak = float(given) * 1e12
                self._source = f"{PEAK_TFLOPS_ENV}={given}"
            except ValueError:
                self._source = f"{PEAK_TFLOPS_ENV}={given!r} is not a number of TFLOP/s"
            if self._peak is not None and self._peak <= 0:
                self._peak, self._source = None, f"{PEAK_TFLOPS_ENV}={given} is not positive"
            return
        if device.type == "cuda":
            try:
                name = torch.cuda.get_device_name(device)
                found = datasheet_peak(name, precision)
            except Exception:
                name, found = "this GPU", None
            if found is None:
                self._source = (
                    f"{name} ({precision}) is not in agent/peak.py's datasheet table, and "
                    f"{PEAK_TFLOPS_ENV}=<dense peak> gives it (the GPU is never probed: "
                    "that would take device memory from the job)"
                )
            else:
                self._peak, self._source = found
            return
        if os.environ.get(PEAK_PROBE_ENV, "1") == "0":
            self._source = f"no datasheet peak for this device, and {PEAK_PROBE_ENV}=0"
            return
        self._source = "peak being measured"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        size = 512
        # Not a daemon: a job that ends while the probe is inside a matmul would otherwise be
        # finalized under it, and torch's thread pool aborted the process ("terminate called
        # without an active exception", exit 134: a 4-step DeepSpeed job under zeroscope run).
        # The interpreter waits for it instead, but only to the end of the matmul under way: a
        # job that ends first stops the probe (a 3-step job's ranks each exited ~0.2 s late).
        # (``threading._register_atexit``: what ``concurrent.futures`` uses to stop its
        # workers, run before the interpreter joins its threads.)
        try:
            threading._register_atexit(self._stop.set)  # type: ignore[attr-defined]
        except Exception:  # finalizing already, or an interpreter without it: the wait
            pass
        self.thread = threading.Thread(
            target=self._measure,
            args=(torch, device, dtype, size, precision),
            name="zeroscope-peak",
            daemon=False,
        )
        self.thread.start()

    def _measure(self, torch: Any, device: Any, dtype: Any, size: int, precision: str) -> None:
        """The best of the job's dtype and fp32: a CPU without 16-bit matmul units runs fp16
        at ~2 % of its fp32 speed (0.84 vs 48 GFLOP/s here), and a 16-bit job there does
        much of its math in fp32, so the fp16 figure was no ceiling (the fp16 demo's MFU read
        20 % at step 1, then NA above 100 % for the rest of the run)."""
        found = [(measure_matmul(torch, device, dtype, size, self.PROBE_S, self._stop), precision)]
        if dtype != torch.float32:
            found.append(
                (
                    measure_matmul(torch, device, torch.float32, size, self.PROBE_S, self._stop),
                    "fp32",
                )
            )
        if self._stop.is_set():
            self._source = "the job ended before the peak was measured"
            return
        measured = [(peak, name) for peak, name in found if peak is not None]
        if not measured:
            self._source = "the peak matmul could not run on this device"
            return
        peak, name = max(measured)
        self._peak = peak
        self._source = f"measured {name} {size}x{size} matmul on {device.type}"
        if name != precision:
            self._source += f", faster here than {precision}'s"

    def figure(self) -> tuple[float | None, str]:
        return self._peak, self._source

    def stop(self) -> None:
        """End a measurement under way after its current matmul (the interpreter's shutdown
        calls this), with no peak."""
        self._stop.set()
