"""``deepspeed.runtime.engine``: the engine class under DeepSpeed's name, so
``isinstance(model, DeepSpeedEngine)`` (accelerate unwraps models that way) holds for it."""

from __future__ import annotations

from zeroscope.engine.engine import ZeroEngine

DeepSpeedEngine = ZeroEngine

__all__ = ["DeepSpeedEngine"]
