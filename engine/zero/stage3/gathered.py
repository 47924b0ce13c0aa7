"""``deepspeed.zero.GatheredParameters`` and ``register_external_parameter``.

``GatheredParameters(params, modifier_rank=r)`` makes the full values of partitioned parameters
visible in ``param.data`` for the duration of the block; on exit rank ``r``'s values are
broadcast and written back into every rank's shard, then the full tensors are freed again.
Without a modifier rank the block is read-only: the shards are left as they were (DeepSpeed
raises when it detects an in-place change then; here such a change is simply dropped).

Two owners of partitioned parameters implement the same three calls (``gather``,
``write_back``, ``release``): :class:`~.zero_init.InitShards` before ``initialize`` (the model
was built under ``zero.Init``), and the stage-3 strategy afterwards (:class:`EngineParams`). A
parameter's owner is ``param._zs_owner``. Parameters that are not partitioned (stages 0-2, or
a plain model) are left alone, as DeepSpeed does, so scripts written for ZeRO-3 run unchanged.

One difference from DeepSpeed on purpose: after ``initialize``, a write-back also updates the
fp32 master copy, so the change survives the next optimizer step (DeepSpeed updates only the
16-bit shard, and its next step overwrites it from the stale master). With ``offload_optimizer``
the master lives off the device and only the 16-bit shard is updated, as in DeepSpeed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from .partition import ParamStatus, ShardedParam

_DEPTH = "_zs_gathered_depth"


class Owner(Protocol):
    def gather(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """Make the full values available; returns the ones that were not available before."""
        ...

    def write_back(self, params: list[nn.Parameter]) -> None:
        """The full ``param.data`` (identical on every rank) becomes the shards."""

    def release(self, params: list[nn.Parameter]) -> None:
        """Free the full values again."""


class EngineParams:
    """The owner of a stage-3 engine's parameters (zero/stage3/strategy.py)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        self.partition = strategy.partition

    def _sps(self, params: list[nn.Parameter]) -> list[ShardedParam]:
        return [self.partition.by_param[p] for p in params]

    def gather(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        missing = [sp for sp in self._sps(params) if sp.status is ParamStatus.NOT_AVAILABLE]
        if missing:
            self.partition.all_gather(missing, prefetched=False).wait()
        return [sp.param for sp in missing]

    def write_back(self, params: list[nn.Parameter]) -> None:
        if "shard_of" in vars(self.partition):
            raise NotImplementedError(
                "GatheredParameters(modifier_rank=...) after initialize() with offload_param is "
                "not supported: modify the parameters before initialize()"
            )
        master = self.strategy.master
        separate_master = master.data_ptr() != self.partition.shards.data_ptr()
        rank = self.partition.rank
        for sp in self._sps(params):
            flat = sp.param.data.reshape(-1)
            piece = flat[rank * sp.shard_numel : (rank + 1) * sp.shard_numel]
            shard = self.partition.shard_of(sp)
            shard.zero_()
            shard[: piece.numel()].copy_(piece)
            if separate_master and sp.offset < master.numel():  # frozen: no master
                master[sp.offset : sp.offset + sp.shard_numel].copy_(shard)

    def release(self, params: list[nn.Parameter]) -> None:
        for sp in self._sps(params):
            if not sp.persistent and sp.status is ParamStatus.AVAILABLE:
                self.partition.release(sp)


def _as_list(params: Any) -> list[Any]:
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, Iterable):
        return list(params)
    return [params]


def register_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """``parameter`` (owned by another module) is used in ``module``'s forward: stage 3 gathers it
    there too (DeepSpeed keeps the list in ``module._external_params``, and so does this)."""
    if not isinstance(parameter, nn.Parameter):
        raise RuntimeError("Parameter is not a torch.nn.Parameter")
    external = module.__dict__.setdefault("_external_params", {})
    external[id(parameter)] = parameter


def unregister_external_parameter(module: nn.Module, parameter: nn.Parameter) -> None:
    """Undo :func:`register_external_parameter`."""
    module.__dict__.get("_external_params", {}).pop(id(parameter), None)


class GatheredParameters:
    """``deepspeed.zero.GatheredParameters(params, modifier_rank=None, fwd_module=None,
    enabled=True)``; see the module docstring. Every rank must enter it with the same
    parameters (they are gathered in ``ds_id`` order, the same on every rank)."""

    def __init__(
        self,
        params: Any,
        modifier_rank: int | None = None,
        fwd_module: nn.Module | None = None,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled
        self.params: list[nn.Parameter] = []
        if not enabled:
            return
        unique = {id(p): p for p in _as_list(params) if hasattr(p, "_zs_owner")}
        self.params = sorted(unique.values(), key=lambda p: p.ds_id)  # type: ignore[attr-defined]
        self.enabled = bool(self.params)
        self.modifier_rank = modifier_rank
        self._gathered: list[tuple[Owner, list[nn.Parameter]]] = []
        if fwd_module is not None:
            for p in self.params:
                register_external_parameter(fwd_module, p)

    def _by_owner(self) -> list[tuple[Owner, list[nn.Parameter]]]:
        groups: dict[int, tuple[Owner, list[nn.Parameter]]] = {}
        for p in self.params:
            owner = p._zs_owner  # type: ignore[attr-defined]
            groups.setdefault(id(owner), (owner, []))[1].append(p)
        return list(groups.values())

    def __enter__(self) -> GatheredParameters:
        if not self.enabled:
            return self
        overlapping = [p.ds_id for p in self.params if getattr(p, _DEPTH, 0) > 0]  # type: ignore[attr-defined]
        if overlapping:
            raise RuntimeError(
                "nested GatheredParameters contexts cannot overlap parameters; ds_ids already "
                f"gathered by an outer context: {overlapping}"
            )
        for owner, params in self._by_owner():
            self._gathered.append((owner, owner.gather(params)))
        for p in self.params:
            setattr(p, _DEPTH, 1)
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        try:
            if self.modifier_rank is not None and exc[0] is None:
                if dist.is_available() and dist.is_initialized():
                    handles = [
                        dist.broadcast(p.data, self.modifier_rank, async_op=True)
                        for p in self.params
                    ]
                    for handle in handles:
                        handle.wait()
                with torch.no_grad():
                    for owner, params in self._by_owner():
                        owner.write_back(params)
            for owner, gathered in self._gathered:
                owner.release(gathered)
        finally:
            self._gathered.clear()
            for p in self.params:
                if hasattr(p, _DEPTH):
                    delattr(p, _DEPTH)
