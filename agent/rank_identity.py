"""What a rank says of itself and where it measures: its Hello (sticky at the publisher, so a
late viewer gets it; sent again when the parallel layout arrives after it) and the device it
binds (CUDA events for the step axis and collectives, the device's peaks and NVML readings; on
CPU the host clock and no device figures). A mixin of :class:`zeroscope.agent.live.LiveTelemetry`,
which owns the attributes named below: split from it for size, not reuse."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

import torch

from .comm import EVENT_DEVICE, CollectiveTracker, _cuda_event
from .device_memory import DevicePeaks, device_capacity, rss_peak
from .publish import Publisher
from .sampler import Sampler, pci_bus_id
from .schema import SCHEMA_VERSION, ConfigSummary, Hello, ParallelLayout, ParamCounts


class RankIdentity:
    """The Hello and the device binding of a live agent (see the module docstring)."""

    publisher: Publisher
    sampler: Sampler
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    local_world_size: int
    spawned: bool
    job_id: str
    engine: str
    errors: int
    step: int
    cuda: bool
    device_index: int | None
    _bound_device: str | None
    _collectives: CollectiveTracker
    _peaks: DevicePeaks | None
    _plain: bool
    _hello_sent: bool
    _hello: tuple[ConfigSummary | None, ParamCounts | None, str]
    _layout: ParallelLayout | None

    def _use_device_events(self, make: Any) -> None:
        raise NotImplementedError

    def _plain_step(self, step: int) -> bool:
        raise NotImplementedError

    def hello(self, *, config: ConfigSummary, params: ParamCounts, device: str = "cpu") -> None:
        try:
            if self._bound_device != device:
                self._bind(device)
            self._send_hello(config, params, device)
        except Exception:
            self.errors += 1

    def bind_device(self, device: str) -> None:
        try:
            self._bind(device)
        except Exception:
            self.errors += 1

    def _bind(self, device: str) -> None:
        """Device mode: CUDA events for the step axis and collectives, the device's peaks and
        NVML readings; the host clock and no device figures on CPU."""
        self._bound_device = device
        self.cuda = device.startswith("cuda")
        self._collectives.cuda = self.cuda
        if self.cuda:
            index = torch.device(device).index
            index = torch.cuda.current_device() if index is None else index
            self.device_index = index
            EVENT_DEVICE[0] = index  # every event on the Hello's device (agent/comm.py)
            uuid = pci_bus = None
            with contextlib.suppress(Exception):
                props = torch.cuda.get_device_properties(index)
                uuid = f"GPU-{props.uuid}"
                pci_bus = pci_bus_id(props)
            self.sampler.set_device(index, uuid, pci_bus)
            # The step's axis becomes the device's; peaks are sampled, never reset. Where
            # no CUDA event can be made (a stubbed or broken runtime) the host clock stays:
            # a step report without device times beats no step report.
            try:
                _cuda_event()
                self._use_device_events(_cuda_event)
            except Exception:
                self._collectives.cuda = False
            self._peaks = DevicePeaks(torch.cuda, index)
            self._plain = self._plain_step(self.step)  # phases sample the peaks now

    def _send_hello(
        self, config: ConfigSummary | None, params: ParamCounts | None, device: str
    ) -> None:
        self._hello_sent = True
        self._hello = (config, params, device)
        self.publisher.set_sticky(
            Hello(
                schema_version=SCHEMA_VERSION,
                job_id=self.job_id,
                rank=self.rank,
                world_size=self.world_size,
                local_rank=self.local_rank,
                node_rank=self.node_rank,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                device=device,
                started_ns=time.time_ns(),
                config=config,
                params=params,
                engine=self.engine,
                parallel=self._layout,
                local_world_size=self.local_world_size,
                device_memory_bytes=device_capacity(device, self.local_world_size),
                init_rss_peak_bytes=rss_peak(),
                spawned=self.spawned,
            )
        )

    def layout(self, layout: ParallelLayout) -> None:
        try:
            self._layout = layout
            if self._hello_sent:  # Hello is sticky: the new one replaces it for late viewers
                self._send_hello(*self._hello)
        except Exception:
            self.errors += 1
