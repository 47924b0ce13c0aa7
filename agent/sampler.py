"""Host and GPU figures, sampled off the training thread, plus the heartbeat.

A daemon thread wakes every ``interval`` seconds, reads the host figures (process CPU %, RSS,
available memory: agent/host_stats.py) and NVML (utilization, memory, power, PCIe TX/RX
throughput) and hands a Heartbeat with them to ``tick``, just before it drains the agent's
outbox: the heartbeat leaves in the same ZeroMQ message as the reports (one wake-up of ZeroMQ's
I/O thread, not two). The latest sample also rides on each StepReport. Without a GPU or NVML
library ``pynvml.nvmlInit()`` raises and every GPU figure stays ``None`` (NA), never 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .host_stats import HostStats
from .schema import HostSample


def pci_bus_id(props: Any) -> str | None:
    """``domain:bus:device.0`` of a ``torch.cuda.get_device_properties`` result (NVML's form),
    or None when torch does not say."""
    try:
        domain, bus, device = (
            int(getattr(props, f"pci_{k}_id")) for k in ("domain", "bus", "device")
        )
    except (AttributeError, TypeError, ValueError):
        return None
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


class _Nvml:
    """NVML handle of this rank's GPU, or nothing. Found by UUID, else by PCI bus id (both name
    the same GPU whatever CUDA_VISIBLE_DEVICES says); the CUDA index is NVML's index only when
    nothing is hidden, so it is the last resort."""

    def __init__(
        self, device_index: int | None, uuid: str | None, pci_bus: str | None = None
    ) -> None:
        self.handle: Any = None
        self.nvml: Any = None
        if device_index is None:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            if uuid:
                self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            elif pci_bus:
                self.handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus)
            else:
                self.handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            self.handle = None

    def fill(self, s: HostSample) -> None:
        h, nv = self.handle, self.nvml
        if h is None:
            return
        for attr, read in (
            ("gpu_util_percent", lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
            ("gpu_mem_used_bytes", lambda: int(nv.nvmlDeviceGetMemoryInfo(h).used)),
            ("gpu_mem_total_bytes", lambda: int(nv.nvmlDeviceGetMemoryInfo(h).total)),
            ("gpu_power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            # NVML reports PCIe throughput in KB/s over a 20 ms window.
            (
                "pcie_tx_bytes_s",
                lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024.0,
            ),
            (
                "pcie_rx_bytes_s",
                lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024.0,
            ),
        ):
            try:
                setattr(s, attr, read())
            except Exception:
                pass  # not supported on this GPU: stays None


class Sampler:
    """Background sampler thread: ``tick(sample)`` is called with each fresh HostSample every
    ``interval`` s; ``poll()`` (the publisher's reconnection check) every ``poll_interval`` s;
    ``drain()`` (the agent's outbox: reports and events to send) every ``drain_interval`` s and
    whenever ``wake`` is raised (a step ended, at most every ``outbox.WAKE_INTERVAL_S``)."""

    def __init__(
        self,
        tick: Callable[[HostSample], None],
        *,
        interval: float = 0.5,
        device_index: int | None = None,
        device_uuid: str | None = None,
        poll: Callable[[], None] | None = None,
        poll_interval: float = 0.5,
        drain: Callable[[], None] | None = None,
        drain_interval: float = 0.05,
        wake: threading.Event | None = None,
    ) -> None:
        self.interval = interval
        self.poll_interval = poll_interval
        self._poll = poll
        self._drain = drain
        self._wake = min(poll_interval, interval, drain_interval if drain else interval)
        self._next_poll = 0.0
        self.latest: HostSample | None = None
        self._tick = tick
        self._stop = threading.Event()
        self._wake_flag = wake if wake is not None else self._stop
        """What the thread sleeps on: the outbox's flag (a report to send) when given."""
        self._device_index = device_index
        self._device_uuid = device_uuid
        self._device_pci: str | None = None
        self._device_changed = False
        self._thread = threading.Thread(target=self._run, name="zeroscope-sampler", daemon=True)
        self.errors = 0

    def set_device(self, index: int, uuid: str | None = None, pci_bus: str | None = None) -> None:
        """This rank's GPU (known once the engine says hello); NVML is (re)opened for it."""
        self._device_index, self._device_uuid, self._device_pci = index, uuid, pci_bus
        self._device_changed = True

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self, wait_s: float = 2.0) -> None:
        self._stop.set()
        self._wake_flag.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=wait_s)

    def _run(self) -> None:
        try:
            stats: HostStats | None = HostStats()
        except Exception:
            stats = None
        nvml = _Nvml(self._device_index, self._device_uuid)
        next_sample = time.monotonic() + self.interval
        flag, stop = self._wake_flag, self._stop
        stretch = 1
        while True:
            woken = flag.wait(self._wake * stretch)
            if stop.is_set():
                break
            # Woken by a step end, the next one is due within the outbox's wake interval (as
            # long as this timer's): the timer then waits twice as long, so that it and the
            # step ends do not take turns waking this thread (the agent's overhead budget, agent/cost.py); it ticks again at its
            # own pace once the step ends stop (an evaluation, a hang).
            stretch = 2 if woken and flag is not stop else 1
            now = time.monotonic()
            if now >= next_sample:  # first: its heartbeat leaves with this wake-up's batch
                next_sample += self.interval
                if next_sample < now:  # a long stall: the next one an interval from now
                    next_sample = now + self.interval
                if self._device_changed:
                    self._device_changed = False
                    nvml = _Nvml(self._device_index, self._device_uuid, self._device_pci)
                self._sample(stats, nvml)
            if flag is not stop:
                flag.clear()  # before draining: a put() from here on raises it again
            if self._drain is not None:
                try:
                    self._drain()
                except Exception:
                    self.errors += 1
            if self._poll is not None and now >= self._next_poll:
                self._next_poll = now + self.poll_interval
                try:
                    self._poll()
                except Exception:
                    self.errors += 1
        if stats is not None:
            stats.close()

    def _sample(self, stats: HostStats | None, nvml: _Nvml) -> None:
        s = HostSample()
        try:
            if stats is not None:
                stats.fill(s)
            nvml.fill(s)
        except Exception:
            self.errors += 1
        self.latest = s
        try:
            self._tick(s)
        except Exception:
            self.errors += 1
