"""The agent reads memory figures of the GPU its Hello names, not of the current device
checked on the CPU with torch's CUDA queries replaced at the boundary.

An agent-API user who never calls ``torch.cuda.set_device`` has every rank's current device at
GPU 0; before the fix every rank then reported GPU 0's allocator figures. Here the current
device is 0, the Hello says ``cuda:1``, and each allocator query must name device 1 and report
its (distinct) figures; NVML is opened by the GPU's UUID, with its PCI bus id as the fallback
(never the CUDA index, which CUDA_VISIBLE_DEVICES renumbers).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.distributed import connected_publisher
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.sampler import pci_bus_id
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, Message, ParamCounts, StepReport
from zeroscope.collector.server import Collector, wait_for


def test_allocator_and_nvml_readings_follow_the_hello_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    per_device = {0: (100, 200, 300), 1: (111, 222, 333)}
    queried: list[tuple[str, Any]] = []

    def reading(kind: int, name: str) -> Any:
        def read(device: Any = None) -> int:
            queried.append((name, device))
            return per_device[0 if device is None else int(device)][kind]

        return read

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", reading(0, "allocated"))
    monkeypatch.setattr(torch.cuda, "memory_reserved", reading(1, "reserved"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", reading(2, "peak"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    props = SimpleNamespace(uuid="1234-abcd", pci_domain_id=0, pci_bus_id=0x65, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)

    got: list[Message] = []
    col = Collector()
    col.add_listener(got.append)
    with col:
        tel = LiveTelemetry(connected_publisher(col.ingest_address), job_id="dev")
        assert tel.publisher.wait_connected(30)  # a report sent before the handshake is dropped
        devices: list[tuple[Any, ...]] = []
        monkeypatch.setattr(tel.sampler, "set_device", lambda *a: devices.append(a))
        tel.hello(
            config=ConfigSummary(stage=0, precision="fp32", dp_world_size=1),
            params=ParamCounts(total=1, trainable=1),
            device="cuda:1",
        )
        # The peak is the step's: device 1's run peak rises during the step (the agent samples
        # peaks and never resets them, so a peak from before it started is not this step's).
        per_device[1] = (111, 222, 444)
        tel.step_end(memory=MemoryBytes(params=1))
        tel.close()
        assert wait_for(lambda: any(isinstance(m, StepReport) for m in got))
    (report,) = [m for m in got if isinstance(m, StepReport)]
    assert (
        report.memory.device_allocated,
        report.memory.device_reserved,
        report.memory.device_peak,
    ) == (111, 222, 444)
    assert queried and {device for _, device in queried} == {1}
    assert devices == [(1, "GPU-1234-abcd", "00000000:65:00.0")]
    assert pci_bus_id(props) == "00000000:65:00.0"
    assert pci_bus_id(SimpleNamespace()) is None
