"""``deepspeed.pipe``: DeepSpeed's pipeline-parallel API (``PipelineModule``, ``LayerSpec``,
``TiedLayerSpec``), built in :mod:`zeroscope.engine.parallel` on torch's pipelining schedules.

DeepSpeed's module also exports ``DualPipeVModule``; here DualPipeV is a schedule instead
(``"pipeline": {"schedule": "dualpipev"}``) of a PipelineModule, so that name is not served. Topologies are in ``deepspeed.runtime.pipe.topology``, as in
DeepSpeed.
"""

from __future__ import annotations

from zeroscope.engine.parallel.pipe import LayerSpec, PipelineModule, TiedLayerSpec

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec"]
