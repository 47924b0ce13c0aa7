"""``deepspeed.runtime.pipe``: where DeepSpeed defines the pipeline API that ``deepspeed.pipe``
re-exports; ``module`` and ``topology`` are its submodules (and attributes, as in DeepSpeed),
``engine`` is imported on use."""

from __future__ import annotations

from .module import LayerSpec, PipelineModule, TiedLayerSpec
from .topology import ProcessTopology

__all__ = ["LayerSpec", "PipelineModule", "ProcessTopology", "TiedLayerSpec"]
