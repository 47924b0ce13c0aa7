"""What an attach reader of one engine answers (DeepSpeed, FSDP2, DDP, a plain optimizer):
the base class every reader subclasses, apart from the session that picks among them
(agent/attach/session.py re-exports both names)."""

from __future__ import annotations

from typing import Any

import torch

from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts, Precision

from .census import Census


def precision_of(dtype: torch.dtype) -> Precision:
    return "bf16" if dtype == torch.bfloat16 else "fp16" if dtype == torch.float16 else "fp32"


class EngineReader:
    """Reads one engine's state into the schema; subclasses know one engine."""

    kind = "torch"
    """Shown in the header (``Hello.engine``)."""
    priority = 0
    """Higher wins when several engines are found in one process (DeepSpeed over DDP)."""

    def alive(self) -> bool:
        """False once the engine object is gone (a later engine takes over)."""
        return True

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        """(config, parameter counts, device) for the Hello."""
        raise NotImplementedError

    def count_grads(self, census: Census) -> None:
        """Gradients held just before the optimizer step."""

    def count_state(self, census: Census) -> None:
        """Parameters (first) and optimizer state, after the optimizer step."""

    def memory_extras(self, memory: MemoryBytes) -> None:
        """Engine-specific fields (persistent or gathered stage-3 parameters)."""

    def layout(self) -> Any:
        """A cheap value that changes when the engine's state changes size (the optimizer
        creating its state on its first real step): memory is then counted again at once."""
        return None

    def private_missing(self) -> list[str]:
        """The private attributes this reader relies on that the live engine lacks (a torch or
        DeepSpeed release renamed them: :mod:`.private_api`); checked once, when found."""
        return []
