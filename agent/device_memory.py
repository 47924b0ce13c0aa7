"""Per-step device memory figures that leave the user's own allocator statistics untouched.

``torch.cuda.reset_peak_memory_stats()`` would give an exact per-step peak, but it resets the
very ``max_memory_allocated`` a training script reads for itself: a profiler must not change
what the user observes. Instead, ``memory_allocated`` (a host-side counter, no device sync) is
sampled at every mark of the step (phase entry and exit, step end), and the allocator's own
peak is read, never reset:

- if the process's peak rose during this step, the step reached it: the step's peak is exact;
- otherwise the step's peak is the highest sample (a lower bound: a transient between two
  marks can be missed).

Also the Hello's capacity figures: this rank's share of its device's memory, and the process's
peak resident set at start-up.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


class DevicePeaks:
    """Allocated / reserved / step-peak bytes of one CUDA device, per step."""

    def __init__(self, cuda: Any, device: Any = None) -> None:
        self.cuda = cuda
        """``torch.cuda`` (a stand-in in tests)."""
        self.device = device
        self._run_peak = int(cuda.max_memory_allocated(device))
        self._step_max = 0

    def sample(self) -> None:
        """One reading at a mark of the step (cheap: a counter read)."""
        allocated = int(self.cuda.memory_allocated(self.device))
        if allocated > self._step_max:
            self._step_max = allocated

    def take(self) -> tuple[int, int, int]:
        """(allocated, reserved, step peak) at the step's end; starts the next step."""
        allocated = int(self.cuda.memory_allocated(self.device))
        reserved = int(self.cuda.memory_reserved(self.device))
        run_peak = int(self.cuda.max_memory_allocated(self.device))
        peak = max(self._step_max, allocated)
        if run_peak > self._run_peak:
            peak = max(peak, run_peak)
            self._run_peak = run_peak
        self._step_max = allocated
        return allocated, reserved, peak


def device_capacity(device: str, local_world_size: int) -> int:
    """This rank's share of its device's memory [bytes]: a GPU's total, or the host's RAM over
    the ranks on the node when the device is the CPU; 0 when unknown."""
    try:
        if device.startswith("cuda"):
            index = torch.device(device).index
            index = torch.cuda.current_device() if index is None else index
            return int(torch.cuda.get_device_properties(index).total_memory)
        import psutil

        return int(psutil.virtual_memory().total) // max(1, local_world_size)
    except Exception:
        return 0


def rss_peak() -> int:
    """The process's peak resident set size so far [bytes] (``ru_maxrss``); 0 when unknown."""
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # Linux: KiB
    except Exception:
        return 0
