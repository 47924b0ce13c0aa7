"""``deepspeed.zero.Init``: partition each parameter as its module is constructed, so no rank
ever holds the whole model (DeepSpeed's runtime/zero/partition_parameters.py ``Init``).

Inside the context every ``nn.Module`` subclass's ``__init__`` is wrapped; when the outermost
``__init__`` of a module returns, each of its own parameters is broadcast from rank 0 (so every
rank starts from the same values, as DeepSpeed does), cast to the training dtype, and cut: rank
``r`` keeps elements ``[r*s, (r+1)*s)`` of the flattened parameter padded to a multiple of N
(``s = ceil(numel / N)``, stage 3's layout, zero/stage3/partition.py) in ``param.ds_tensor``,
and ``param.data`` becomes an empty placeholder. At most one module's full parameters exist at a
time. ``initialize`` then adopts the shards as they are (stage 3), or gathers them back whole
(stages 0-2).

The parameters carry DeepSpeed's attributes: ``ds_id``, ``ds_numel``, ``ds_shape``,
``ds_tensor``, ``ds_status``. Unlike DeepSpeed, tensor constructors are not patched: a module's
parameters are created (and randomly initialized) in their own dtype and rounded to 16 bits when
partitioned, where DeepSpeed draws them in 16 bits directly.
"""

from __future__ import annotations

import enum
import functools
import itertools
import math
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

_ids = itertools.count()
# torch >= 2.13 names it all_gather_single; older releases only have all_gather_into_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class ZeroParamStatus(enum.Enum):
    """DeepSpeed's ``ZeroParamStatus`` (same values)."""

    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


def next_param_id() -> int:
    """A process-wide unique ``ds_id`` (GatheredParameters sorts by it so that every rank
    gathers in the same order)."""
    return next(_ids)


def is_zero_init_param(param: Any) -> bool:
    """Partitioned by ``zero.Init`` and not yet adopted by an engine."""
    return isinstance(param, torch.Tensor) and hasattr(param, "ds_tensor")


def full_shape(param: torch.Tensor) -> torch.Size:
    """The parameter's real shape, also while it is a partitioned placeholder."""
    shape = getattr(param, "ds_shape", None)
    return torch.Size(shape) if shape is not None and param.numel() == 0 else param.shape


def _world() -> tuple[int, int, Any]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), None
    return 0, 1, None


def shard_numel(numel: int, world_size: int) -> int:
    return math.ceil(numel / world_size)


class InitShards:
    """Owner of parameters partitioned by ``zero.Init`` before an engine adopts them: gathers,
    releases and writes back one parameter's ``ds_tensor`` at a time."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.rank, self.world_size, self.group = _world()
        self.dtype = dtype

    def partition(self, param: nn.Parameter) -> None:
        """Broadcast rank 0's value, keep this rank's slice, free the full tensor."""
        full = param.data
        if self.dtype is not None and full.is_floating_point():
            full = full.to(self.dtype)
        full = full.contiguous()
        if self.world_size > 1:
            dist.broadcast(full, src=0, group=self.group)
        param.ds_id = next_param_id()  # type: ignore[attr-defined]
        param.ds_numel = full.numel()  # type: ignore[attr-defined]
        param.ds_shape = full.shape  # type: ignore[attr-defined]
        param.ds_persist = False  # type: ignore[attr-defined]
        param._zs_owner = self  # type: ignore[attr-defined]
        param.ds_tensor = self._slice(full.reshape(-1))  # type: ignore[attr-defined]
        param.data = torch.empty(0, dtype=full.dtype, device=full.device)
        param.ds_status = ZeroParamStatus.NOT_AVAILABLE  # type: ignore[attr-defined]

    def _slice(self, flat: torch.Tensor) -> torch.Tensor:
        s = shard_numel(flat.numel(), self.world_size)
        piece = flat[self.rank * s : (self.rank + 1) * s]
        if piece.numel() < s:  # the last ranks hold the padding
            piece = torch.cat([piece, flat.new_zeros(s - piece.numel())])
        return piece.clone()

    def full_value(self, param: nn.Parameter) -> torch.Tensor:
        """The whole parameter, all-gathered from every rank's ``ds_tensor``."""
        shard = param.ds_tensor  # type: ignore[attr-defined]
        if self.world_size == 1:
            out = shard
        else:
            out = shard.new_empty(shard.numel() * self.world_size)
            _all_gather(out, shard.contiguous(), group=self.group)
        return out[: param.ds_numel].view(param.ds_shape).clone()  # type: ignore[attr-defined]

    # -- the owner protocol of zero/stage3/gathered.py --------------------------------------

    def gather(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        gathered = []
        for param in params:
            if param.ds_status is ZeroParamStatus.AVAILABLE:  # type: ignore[attr-defined]
                continue
            param.data = self.full_value(param)
            param.ds_status = ZeroParamStatus.AVAILABLE  # type: ignore[attr-defined]
            gathered.append(param)
        return gathered

    def write_back(self, params: list[nn.Parameter]) -> None:
        for param in params:
            param.ds_tensor = self._slice(param.data.reshape(-1))  # type: ignore[attr-defined]

    def release(self, params: list[nn.Parameter]) -> None:
        for param in params:
            param.data = torch.empty(0, dtype=param.dtype, device=param.device)
            param.ds_status = ZeroParamStatus.NOT_AVAILABLE  # type: ignore[attr-defined]


def materialize(module: nn.Module) -> None:
    """Gather every ``zero.Init`` parameter of ``module`` back whole (for stages 0-2, which keep
    full parameters) and drop its ZeRO attributes."""
    for param in module.parameters():
        if is_zero_init_param(param):
            param._zs_owner.gather([param])  # type: ignore[attr-defined]
            forget(param)


def forget(param: nn.Parameter) -> None:
    """Drop the attributes ``zero.Init`` put on a parameter (the engine owns it now)."""
    for name in ("ds_tensor", "ds_status", "_zs_owner"):
        if hasattr(param, name):
            delattr(param, name)


def _dtype_from(config: Any, dtype: torch.dtype | None) -> torch.dtype | None:
    """DeepSpeed's ``Init._set_dtype``: an explicit dtype; else the config's precision; else
    fp16 where the device has it (CUDA) and bf16 on the CPU."""
    if dtype is not None:
        return dtype
    if config is not None:
        from zeroscope.engine.config import read_config, read_raw

        raw = read_raw(config)  # only the precision matters here (batch keys may be "auto")
        precision_only = {k: raw[k] for k in ("fp16", "bf16", "bfloat16") if k in raw}
        cfg = read_config(precision_only)
        return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision, torch.float32)
    return torch.float16 if torch.cuda.is_available() else torch.bfloat16


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in type.__subclasses__(cls):
        yield sub
        yield from _subclasses(sub)


_ENTERED = "_zs_init_entered"


class ZeroInit:
    """``deepspeed.zero.Init`` (the signature is DeepSpeed's; see the module docstring).

    ``config_dict_or_path`` / ``config``: the ds_config (its fp16/bf16 choose the dtype).
    ``module``: partition an already-built module now instead of acting as a context.
    ``enabled=False`` makes it a no-op. Process groups other than the default one, remote
    devices and quantized initialization are refused or ignored as noted."""

    def __init__(
        self,
        module: nn.Module | None = None,
        data_parallel_group: Any = None,
        mem_efficient_linear: bool = True,
        remote_device: str | None = None,
        pin_memory: bool = False,
        config_dict_or_path: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        enabled: bool = True,
        dtype: torch.dtype | None = None,
        mpu: Any = None,
        zero_param_parallel_group: Any = None,
        zero_quantized_weights: bool = False,
        zero_quantized_nontrainable_weights: bool = False,
        sequence_data_parallel_group: Any = None,
        param_swapper: Any = None,
        **_: Any,
    ) -> None:
        self.enabled = enabled
        if not enabled:
            return
        if mpu is not None or zero_param_parallel_group is not None:
            raise ValueError("zero.Init: model parallelism (mpu) is not supported")
        if zero_quantized_weights or zero_quantized_nontrainable_weights:
            raise ValueError("zero.Init: quantized weights are not supported")
        from zeroscope.engine.api import init_distributed

        init_distributed()
        source = config_dict_or_path if config_dict_or_path is not None else config
        self.shards = InitShards(_dtype_from(source, dtype))
        self._patched: list[tuple[type, Callable[..., None]]] = []
        self._init_subclass: Any = None
        if module is not None:
            for sub in module.modules():
                self._partition_module(sub)

    def _partition_module(self, module: nn.Module) -> None:
        for param in module.parameters(recurse=False):
            if not hasattr(param, "ds_id"):
                self.shards.partition(param)

    def _wrap(self, cls: type) -> None:
        original = cls.__dict__.get("__init__")
        if original is None or getattr(original, "_zs_wrapped", False):
            return
        init = self

        @functools.wraps(original)
        def wrapper(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            outermost = not module.__dict__.get(_ENTERED, False)
            if outermost:
                module.__dict__[_ENTERED] = True
            try:
                original(module, *args, **kwargs)
            finally:
                if outermost:
                    module.__dict__.pop(_ENTERED, None)
            if outermost:
                init._partition_module(module)

        wrapper._zs_wrapped = True  # type: ignore[attr-defined]
        try:
            type.__setattr__(cls, "__init__", wrapper)
        except TypeError:  # a class that refuses new attributes: its modules stay whole
            return
        self._patched.append((cls, original))

    def __enter__(self) -> ZeroInit:
        if not self.enabled:
            return self
        for cls in [nn.Module, *_subclasses(nn.Module)]:
            self._wrap(cls)
        # Classes defined inside the context are wrapped as they are created.
        self._init_subclass = nn.Module.__dict__.get("__init_subclass__")
        init = self

        def init_subclass(cls: Any, **kwargs: Any) -> None:
            super(nn.Module, cls).__init_subclass__(**kwargs)  # type: ignore[misc]
            init._wrap(cls)

        nn.Module.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment,method-assign]
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.enabled:
            return
        for cls, original in reversed(self._patched):
            type.__setattr__(cls, "__init__", original)
        self._patched.clear()
        if self._init_subclass is None:
            del nn.Module.__init_subclass__
        else:
            nn.Module.__init_subclass__ = self._init_subclass  # type: ignore[method-assign]
