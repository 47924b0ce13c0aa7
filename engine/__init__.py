"""The bundled ZeRO 0/1/2/3 training engine, configured by DeepSpeed's ds_config.json.

A DeepSpeed script ports by changing its import::

    import zeroscope.engine as deepspeed
    engine, optimizer, loader, scheduler = deepspeed.initialize(model=..., config="ds_config.json")

Attributes are resolved lazily (PEP 562) so that importing the package costs nothing: the UI
side and ``zeroscope estimate`` must not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PipelineModule", "initialize", "pipe"]


def __getattr__(name: str) -> Any:
    if name == "initialize":
        from .api import initialize

        return initialize
    if name == "pipe":  # deepspeed.pipe
        from .parallel import pipe

        return pipe
    if name == "PipelineModule":  # deepspeed.PipelineModule
        from .parallel.pipe import PipelineModule

        return PipelineModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
