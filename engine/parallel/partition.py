"""How a pipeline's layers are cut into stages: ``partition_method`` of DeepSpeed's
PipelineModule (runtime/pipe/module.py ``_partition_layers``), plus ``'profile'``.

- ``'uniform'``: the same number of layers per stage (ds_utils.partition_uniform);
- ``'parameters'``: balance trainable parameter counts (ds_utils.partition_balanced: the linear
  partition problem by dynamic programming, minimising max - min of the parts);
- ``'type:REGEX'``: balance the number of layers whose class name matches;
- ``'profile'`` (DeepSpeed raises NotImplementedError): balance *measured* per-layer forward +
  backward time (see :mod:`.profile`). Parameter counts say little about time: an attention
  block, an activation or a layer run at a longer sequence costs time without parameters, and a
  stage that takes longer than the others leaves every other stage idle (the bubble).

Parts are boundaries ``parts[s] <= layer < parts[s + 1]``, identical to DeepSpeed's for the same
weights (tests compare against DeepSpeed's own functions).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Boundaries giving each part ``num_items // num_parts`` items, the first parts one more."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    chunk, residual = divmod(num_items, num_parts)
    return [p * chunk + min(p, residual) for p in range(num_parts + 1)]


def partition_balanced(weights: Sequence[float], num_parts: int) -> list[int]:
    """Contiguous parts whose weight sums are as even as possible (DeepSpeed's DP: minimise the
    spread max - min, later split points winning ties)."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    inf = math.inf
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    dp_max = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_min = [[inf] * (m + 1) for _ in range(n + 1)]
    dp_cost = [[inf] * (m + 1) for _ in range(n + 1)]
    position = [[0] * (m + 1) for _ in range(n + 1)]
    dp_max[0][0] = 0.0
    dp_cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            for k in range(i):
                part = prefix[i] - prefix[k]
                max_sum = max(dp_max[k][j - 1], part)
                min_sum = min(dp_min[k][j - 1], part)
                cost = max_sum - min_sum
                if dp_cost[i][j] >= cost:
                    dp_cost[i][j] = cost
                    dp_max[i][j] = max_sum
                    dp_min[i][j] = min_sum
                    position[i][j] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(position[parts[-1]][j])
    return parts[::-1]


def layer_name(layer: Any) -> str | None:
    """The class (or function) name ``type:REGEX`` matches against."""
    from .pipe_module import LayerSpec

    if isinstance(layer, LayerSpec):
        return layer.typename.__name__
    if isinstance(layer, nn.Module):
        return type(layer).__name__
    return getattr(layer, "__name__", None)


def count_layer_params(layers: Sequence[Any]) -> list[int]:
    """Trainable elements of each layer (a LayerSpec is built once to count, as DeepSpeed)."""
    from .pipe_module import LayerSpec

    counts = []
    for layer in layers:
        module = layer.build() if isinstance(layer, LayerSpec) else layer
        counts.append(
            sum(p.numel() for p in module.parameters() if p.requires_grad)
            if isinstance(module, nn.Module)
            else 0
        )
    return counts


def type_weights(layers: Sequence[Any], pattern: str) -> list[int]:
    """1 for each layer whose name matches ``pattern`` (case-insensitive), else 0."""
    regex = re.compile(pattern, re.IGNORECASE)
    weights = [1 if (name := layer_name(layer)) and regex.search(name) else 0 for layer in layers]
    if not any(weights):
        raise ValueError(f"Partitioning '{pattern}' found no valid layers to partition.")
    return weights


def partition_layers(
    layers: Sequence[Any],
    num_parts: int,
    method: str,
    *,
    profile: Callable[[], list[float]] | None = None,
) -> list[int]:
    """Boundaries of ``num_parts`` parts by ``method`` (see the module docstring)."""
    method = method.lower()
    if method == "uniform":
        return partition_uniform(len(layers), num_parts)
    if method == "parameters":
        return partition_balanced(count_layer_params(layers), num_parts)
    if method.startswith("type:"):
        return partition_balanced(type_weights(layers, method.split(":", 1)[1]), num_parts)
    if method == "profile":
        if profile is None:
            raise ValueError("partition_method='profile' needs an example input (profile_input=)")
        return partition_balanced(profile(), num_parts)
    raise ValueError(
        f"partition_method {method!r} is not one of 'parameters', 'uniform', 'type:REGEX', "
        f"'profile'"
    )
