"""Tensor parallelism on ``torch.distributed.tensor.parallel.parallelize_module`` (Megatron's
column/row split: a column-parallel linear shards its output features and needs no
communication in forward; the row-parallel linear after it shards its input features and
all-reduces its output; backward mirrors it), over the mesh's ``tp`` axis.

The plan comes from, in order:

1. ds_config ``tensor_parallel.partition_config.layer_specs`` (DeepSpeed's AutoTP rules): each
   spec's ``patterns`` are regexes over parameter names; ``partition_type`` ``"column"`` makes
   the owning module ColwiseParallel, ``"row"`` RowwiseParallel;
2. the model's own plan, as Hugging Face models carry it (``model._tp_plan`` or
   ``config.base_model_tp_plan``: module paths with ``*`` -> ``"colwise"`` / ``"rowwise"``).

Parameters then are DTensors; the ZeRO strategies see their local shards through
:class:`LocalParam` (zero copies: the shard's storage is moved into the strategy's flat
buffers like any other parameter's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zeroscope.engine.config import ConfigError

_STYLES = {
    "colwise": "col",
    "column": "col",
    "rowwise": "row",
    "row": "row",
    "colwise_rep": "col_rep",
    "colwise_gather_output": "col_rep",
    "embedding_rowwise": "row_rep",
}
"""DeepSpeed's partition types and Hugging Face's plan words -> styles (``col_rep``: the
column-parallel output is all-gathered back to whole, e.g. an lm_head's logits; ``row_rep``: a
row-parallel module fed the whole input, e.g. a vocabulary-sharded embedding)."""


def _style(kind: str, where: str) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    short = _STYLES.get(str(kind).lower())
    if short is None:
        raise ConfigError(
            f"{where}: tensor-parallel style {kind!r} is not supported ({', '.join(_STYLES)})"
        )
    if short == "col_rep":
        return ColwiseParallel(output_layouts=Replicate())
    if short == "row_rep":
        return RowwiseParallel(input_layouts=Replicate())
    return ColwiseParallel() if short == "col" else RowwiseParallel()


def plan_from_layer_specs(model: nn.Module, specs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """DeepSpeed ``partition_config.layer_specs`` -> {module path: ParallelStyle}."""
    plan: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    names = [n for n, _ in model.named_parameters()]
    for i, spec in enumerate(specs):
        where = f"tensor_parallel.partition_config.layer_specs[{i}]"
        kind = str(spec.get("partition_type"))
        unknown = set(spec) - {"patterns", "partition_type"}
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]} is not supported")
        if kind == "skip":
            continue
        regexes = [re.compile(p) for p in spec.get("patterns") or []]
        for name in names:
            if any(r.search(name) for r in regexes):
                module = name.rsplit(".", 1)[0] if "." in name else ""
                if kinds.get(module, kind) != kind:
                    raise ConfigError(f"{where}: module {module!r} is both row and column")
                kinds[module] = kind
                plan[module] = _style(kind, where)
    if not plan:
        raise ConfigError("tensor_parallel.partition_config.layer_specs matched no parameter")
    return plan


def model_plan(model: nn.Module) -> dict[str, Any] | None:
    """A Hugging Face model's own plan: ``config.base_model_tp_plan`` (under the base model's
    prefix) plus the head's ``_tp_plan``; None when the model carries neither."""
    plan: dict[str, str] = {}
    base = getattr(getattr(model, "config", None), "base_model_tp_plan", None) or {}
    prefix = getattr(model, "base_model_prefix", "")
    inner = bool(prefix) and isinstance(getattr(model, prefix, None), nn.Module)
    plan.update({(f"{prefix}.{k}" if inner else k): v for k, v in base.items()})
    plan.update(getattr(model, "_tp_plan", None) or {})
    if not plan:
        return None
    return {path: _style(kind, f"model tp plan {path!r}") for path, kind in plan.items()}


def resolve_plan(model: nn.Module, partition_config: Mapping[str, Any] | None) -> dict[str, Any]:
    specs = (partition_config or {}).get("layer_specs")
    if specs:
        return plan_from_layer_specs(model, list(specs))
    plan = model_plan(model)
    if plan is None:
        raise ConfigError(
            "tensor parallelism needs a plan: give tensor_parallel.partition_config.layer_specs "
            "(DeepSpeed's AutoTP rules: regex patterns over parameter names -> column/row), or a "
            "model that carries one (Hugging Face _tp_plan)"
        )
    return plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, plan: dict[str, Any]) -> dict[int, Any]:
    """Parallelize ``model`` in place; returns {id(old parameter): new parameter} (the parallel
    modules get new Parameter objects). Parameters and buffers left whole are made equal across
    the tensor-parallel group (rank 0's), since every shard computes with them."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    before = {name: p for name, p in model.named_parameters()}
    parallelize_module(model, tp_mesh, plan)
    group = tp_mesh.get_group()
    src = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if not isinstance(tensor, DTensor):
                dist.broadcast(tensor.data, src=src, group=group)
    after = dict(model.named_parameters())
    return {id(p): after[name] for name, p in before.items() if name in after}


def is_sharded(param: torch.Tensor) -> bool:
    """A DTensor parameter split over its mesh (its shards hold different elements)."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(param, DTensor) and any(isinstance(p, Shard) for p in param.placements)


class LocalParam:
    """A DTensor parameter as the ZeRO strategies see it: its local shard, with ``data`` and
    ``grad`` reading and writing the shard. One proxy per parameter (strategies key on id())."""

    __slots__ = ("param",)

    def __init__(self, param: Any) -> None:
        self.param = param

    @property
    def _local(self) -> torch.Tensor:
        return self.param._local_tensor

    @property
    def shape(self) -> torch.Size:
        return self._local.shape

    @property
    def dtype(self) -> torch.dtype:
        return self._local.dtype

    @property
    def device(self) -> torch.device:
        return self._local.device

    @property
    def requires_grad(self) -> bool:
        return bool(self.param.requires_grad)

    def numel(self) -> int:
        return self._local.numel()

    def element_size(self) -> int:
        return self._local.element_size()

    def detach(self) -> torch.Tensor:
        return self._local.detach()

    @property
    def data(self) -> torch.Tensor:
        return self._local

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        if value.shape != self._local.shape:
            raise ValueError(f"local shard is {tuple(self._local.shape)}, got {tuple(value.shape)}")
        self.param._local_tensor = value

    @property
    def grad(self) -> torch.Tensor | None:
        p = self.param
        g = p.grad
        if g is None:
            return None
        if tuple(g.placements) != tuple(p.placements):
            # autograd may hand back a differently laid-out gradient (e.g. whole, for a
            # vocabulary-sharded weight): lay it out like the parameter, once
            g = p.grad = g.redistribute(p.device_mesh, p.placements)
        return g._local_tensor

    @grad.setter
    def grad(self, value: torch.Tensor | None) -> None:
        from torch.distributed.tensor import DTensor

        p = self.param
        p.grad = (
            None
            if value is None
            else DTensor.from_local(
                value,
                p.device_mesh,
                p.placements,
                run_check=False,
                shape=p.shape,
                stride=p.stride(),
            )
        )

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        return self.param.register_post_accumulate_grad_hook(lambda _p: hook(self))
