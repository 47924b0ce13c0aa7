"""``deepspeed.runtime.pipe.module``: the PipelineModule and its layer specs."""

from __future__ import annotations

from zeroscope.engine.parallel.pipe_module import (
    LayerSpec,
    PipelineError,
    PipelineModule,
    TiedLayerSpec,
)

__all__ = ["LayerSpec", "PipelineError", "PipelineModule", "TiedLayerSpec"]
