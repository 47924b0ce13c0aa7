"""``deepspeed.runtime.pipe.topology``: process topologies (Megatron-DeepSpeed imports
``PipeModelDataParallelTopology`` from here)."""

from __future__ import annotations

from zeroscope.engine.parallel.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
)

__all__ = ["PipeDataParallelTopology", "PipeModelDataParallelTopology", "ProcessTopology"]
