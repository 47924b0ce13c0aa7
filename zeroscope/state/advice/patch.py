"""A change's ds_config keys applied to a raw ds_config (pure: a dict in, a new dict out)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def apply_change(raw: Mapping[str, Any], keys: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``raw`` with each dotted key set (``None`` removes it); intermediate
    blocks are created as needed. ``{"zero_optimization.stage": 2}`` sets
    ``raw["zero_optimization"]["stage"] = 2``."""
    out: dict[str, Any] = copy.deepcopy(dict(raw))
    for dotted, value in keys.items():
        *path, last = dotted.split(".")
        node = out
        for part in path:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return out
