"""A Telemetry that records what an engine reports, for assertions in tests (any engine, any
helper). Install it with ``zeroscope.agent.api.set_telemetry(RecordingTelemetry())`` before
building the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from zeroscope.agent.api import Telemetry, Waitable
from zeroscope.agent.schema import MemoryBytes


def in_backward() -> bool:
    """True while autograd is running a backward pass (e.g. inside a gradient hook)."""
    return bool(torch._C._current_graph_task_id() != -1)


@dataclass
class CollectiveRecord:
    op: str
    nbytes: int
    group_size: int
    label: str
    issued_in_backward: bool = False
    waited_in_backward: bool | None = None
    """None until wait() is called on the handle the engine got back."""


class _Handle:
    def __init__(self, work: Waitable, record: CollectiveRecord) -> None:
        self.work, self.record = work, record

    def wait(self) -> Any:
        self.record.waited_in_backward = in_backward()
        return self.work.wait()


@dataclass
class StepRecord:
    memory: MemoryBytes
    figures: dict[str, Any]
    collectives: list[CollectiveRecord] = field(default_factory=list)


class RecordingTelemetry(Telemetry):
    """Keeps hello, events, and per step: memory, figures and the collectives issued in it."""

    enabled = True

    def __init__(self) -> None:
        self.hellos: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, float | None]] = []
        self.steps: list[StepRecord] = []
        self.pending: list[CollectiveRecord] = []
        self.init_collectives: list[CollectiveRecord] = []
        self.layouts: list[Any] = []
        """ParallelLayout messages (3D-parallel engines)."""
        self.pipelines: list[Any] = []
        """PipelineStep of each step (pipeline engines)."""

    def hello(self, *, config: Any, params: Any, device: str = "cpu") -> None:
        self.hellos.append({"config": config, "params": params, "device": device})
        # collectives issued while the engine was being built (e.g. the initial broadcast)
        self.init_collectives, self.pending = self.pending, []

    def collective(
        self,
        work: Waitable,
        *,
        op: Any,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
    ) -> Waitable:
        record = CollectiveRecord(op, nbytes, group_size, label, in_backward())
        self.pending.append(record)
        return _Handle(work, record)

    def event(self, kind: Any, message: str = "", value: float | None = None) -> None:
        self.events.append((kind, message, value))

    def layout(self, layout: Any) -> None:
        self.layouts.append(layout)

    def pipeline(self, step: Any) -> None:
        self.pipelines.append(step)

    def step_end(self, *, memory: MemoryBytes, **figures: Any) -> None:
        self.steps.append(StepRecord(memory, figures, self.pending))
        self.pending = []
