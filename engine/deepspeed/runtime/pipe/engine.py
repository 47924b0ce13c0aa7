"""``deepspeed.runtime.pipe.engine``: the engine ``initialize`` returns for a PipelineModule."""

from __future__ import annotations

from zeroscope.engine.parallel.pipe_engine import PipelineEngine

__all__ = ["PipelineEngine"]
