"""``deepspeed.runtime``: ``engine``, ``zero``, ``lr_schedules`` (imported on first use)."""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = ("engine", "zero", "lr_schedules")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(
        f"module 'deepspeed.runtime' (zeroscope's engine) has no attribute {name!r}"
    )
