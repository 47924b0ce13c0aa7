"""``deepspeed.zero`` (DeepSpeed's ``deepspeed.zero`` is this package, ``runtime.zero``):
``Init``, ``GatheredParameters``, ``register_external_parameter``, ``ZeroParamStatus``."""

from __future__ import annotations

from .partition_parameters import (
    GatheredParameters,
    Init,
    ZeroParamStatus,
    register_external_parameter,
    unregister_external_parameter,
)

__all__ = [
    "GatheredParameters",
    "Init",
    "ZeroParamStatus",
    "register_external_parameter",
    "unregister_external_parameter",
]
