"""ZeRO stages: partition math, the per-stage strategies and the strategy protocol.

Like DeepSpeed's ``deepspeed.zero`` (which is DeepSpeed's internal ``runtime.zero`` package),
this package's namespace also carries the public ZeRO-3 API, so ``import zeroscope.engine as
deepspeed; deepspeed.zero.Init(...)`` works: ``Init``, ``GatheredParameters``,
``register_external_parameter``, ``unregister_external_parameter``, ``ZeroParamStatus``
(zero/stage3/zero_init.py and zero/stage3/gathered.py), resolved on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Init": ("zero_init", "ZeroInit"),
    "ZeroParamStatus": ("zero_init", "ZeroParamStatus"),
    "GatheredParameters": ("gathered", "GatheredParameters"),
    "register_external_parameter": ("gathered", "register_external_parameter"),
    "unregister_external_parameter": ("gathered", "unregister_external_parameter"),
}


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        module, attr = _PUBLIC[name]
        return getattr(importlib.import_module(f"{__name__}.stage3.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
