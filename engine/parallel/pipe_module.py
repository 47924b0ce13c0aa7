"""DeepSpeed's pipeline module API (``deepspeed.pipe``): ``LayerSpec``, ``TiedLayerSpec`` and
``PipelineModule`` (DeepSpeed runtime/pipe/module.py), built on a :class:`~.mesh.ParallelMesh`.

A PipelineModule is a list of layers (modules, LayerSpecs that build them, or plain callables
such as a lambda) whose forward is ``x = layer(x)`` in turn. Each rank builds only the layers of
its own stage(s); layer ``i`` is registered as ``str(i)`` and tied modules under
``tied_modules.<key>``, DeepSpeed's names, so state dicts line up.

Beyond DeepSpeed: ``virtual_stages=V`` cuts the layers into ``num_stages * V`` chunks for the
interleaved and zero-bubble schedules, placed round-robin (``stage_placement='loop'``: rank r
holds chunks r, r + p, ...) or in a V (``'v'``: r and 2p - 1 - r, for ZBV / DualPipeV); and
``partition_method='profile'`` (with ``profile_input=``, an example micro-batch).
"""

from __future__ import annotations

import functools
import os
import random
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn

from .mesh import ParallelMesh
from .partition import partition_layers
from .profile import profiled_weights
from .topology import PipeDataParallelTopology, ProcessTopology


class PipelineError(Exception):
    """Errors related to the use of PipelineModule (DeepSpeed's name)."""


class LayerSpec:
    """A layer to build later, on the stage that owns it: ``LayerSpec(nn.Linear, 4, 8)``."""

    def __init__(self, typename: type[nn.Module], *module_args: Any, **module_kwargs: Any):
        if not (isinstance(typename, type) and issubclass(typename, nn.Module)):
            raise RuntimeError("LayerSpec only supports torch.nn.Module types.")
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def __repr__(self) -> str:
        args = [repr(a) for a in self.module_args]
        args += [f"{k}={v!r}" for k, v in self.module_kwargs.items()]
        return f"{self.typename.__name__}({', '.join(args)})"

    def build(self, log: bool = False) -> nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)


class TiedLayerSpec(LayerSpec):
    """A layer whose weights (``tied_weight_attr``) are shared by every use of ``key``, on any
    stage: gradients are all-reduced over the stages holding it before the optimizer step."""

    def __init__(
        self,
        key: str,
        typename: type[nn.Module],
        *module_args: Any,
        forward_fn: Callable[..., Any] | None = None,
        tied_weight_attr: str | list[str] = "weight",
        **module_kwargs: Any,
    ) -> None:
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = (
            [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)
        )


def set_random_seed(seed: int) -> None:
    """DeepSpeed's ds_utils.set_random_seed: Python, NumPy and torch."""
    import numpy

    random.seed(seed)
    numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class StageChunk(nn.Module):
    """One pipeline stage's consecutive layers: the submodule a PipelineStage runs."""

    def __init__(self, owner: PipelineModule, index: int, start: int, stop: int) -> None:
        super().__init__()
        self.stage_index, self.start, self.stop = index, start, stop
        self.funcs: list[Any] = []
        self._owner = [owner]  # a list, so the owner is not registered as a child
        for idx in range(start, stop):
            fn = owner.layer_funcs[idx]
            self.funcs.append(fn)
            module = fn.args[0] if isinstance(fn, functools.partial) else fn
            if isinstance(module, nn.Module) and not any(module is m for m in self.children()):
                self.add_module(str(idx), module)

    def _run(self, lo: int, hi: int) -> Callable[..., Any]:
        owner = self._owner[0]

        def run(*inputs: Any) -> Any:
            x: Any = inputs[0] if len(inputs) == 1 else inputs
            for offset, fn in enumerate(self.funcs[lo:hi]):
                if owner.seed_layers:
                    seed = owner.base_seed * owner.micro_offset + self.start + lo + offset
                    (owner.seed_fn or set_random_seed)(seed)
                x = fn(x)
            return x

        return run

    def forward(self, *inputs: Any) -> Any:
        owner = self._owner[0]
        owner.micro_offset += 1
        interval = owner.activation_checkpoint_interval
        if interval <= 0:
            return self._run(0, len(self.funcs))(*inputs)
        x: Any = inputs
        for lo in range(0, len(self.funcs), interval):
            hi = min(lo + interval, len(self.funcs))
            args = x if isinstance(x, tuple) else (x,)
            if owner.checkpointable(self.funcs[lo:hi]):
                x = owner.activation_checkpoint_func(self._run(lo, hi), *args)
            else:
                x = self._run(lo, hi)(*args)
        return x


def _checkpoint(fn: Callable[..., Any], *args: Any) -> Any:
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


class PipelineModule(nn.Module):
    """DeepSpeed's PipelineModule (see the module docstring)."""

    def __init__(
        self,
        layers: Iterable[Any],
        num_stages: int | None = None,
        topology: ProcessTopology | None = None,
        loss_fn: Callable[..., Any] | None = None,
        seed_layers: bool = False,
        seed_fn: Callable[[int], None] | None = None,
        base_seed: int = 1234,
        partition_method: str = "parameters",
        activation_checkpoint_interval: int = 0,
        activation_checkpoint_func: Callable[..., Any] | None = None,
        checkpointable_layers: list[str] | None = None,
        dynamic_shape: bool = False,
        *,
        virtual_stages: int = 1,
        stage_placement: Literal["loop", "v"] = "loop",
        profile_input: Any = None,
    ) -> None:
        super().__init__()
        if num_stages is None and topology is None:
            raise RuntimeError("must provide num_stages or topology")
        from zeroscope.engine.process_group import init_distributed, pick_device

        device = pick_device()
        init_distributed(device)
        if not dist.is_initialized():
            # One process without torchrun (DeepSpeed's init_distributed does the same): the
            # pipeline schedules need a process group, even of one rank.
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        world = dist.get_world_size()
        if topology is None:
            assert num_stages is not None
            if world % num_stages != 0:
                raise RuntimeError(
                    f"num_stages ({num_stages}) must divide distributed world size ({world})"
                )
            topology = PipeDataParallelTopology(num_pp=num_stages, num_dp=world // num_stages)
        if virtual_stages < 1 or (stage_placement == "v" and virtual_stages != 2):
            raise ValueError(
                f"virtual_stages={virtual_stages} with stage_placement={stage_placement!r}: "
                f"need >= 1, and exactly 2 for the 'v' placement"
            )
        self.loss_fn = loss_fn
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func or _checkpoint
        self.checkpointable_layers = checkpointable_layers
        self.dynamic_shape = dynamic_shape
        self.micro_offset = 0
        self.partition_method = partition_method
        self._topo = topology
        self.mesh = ParallelMesh(topology, device.type)
        from .grid import PipelineGrid

        self._grid = PipelineGrid(self.mesh)
        self.global_rank = self.mesh.rank
        self.world_size = world
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.num_stages = topology.get_dim("pipe")
        self.stage_id = self.mesh.coords.pp
        self.virtual_stages, self.stage_placement = virtual_stages, stage_placement
        self._layer_specs = list(layers)
        self._num_layers = len(self._layer_specs)
        self.total_chunks = self.num_stages * virtual_stages
        self.parts = partition_layers(
            self._layer_specs,
            self.total_chunks,
            partition_method,
            profile=None
            if profile_input is None
            else functools.partial(profiled_weights, self._build_all, profile_input, device=device),
        )
        self.stage_indices = self._my_stages()
        self.tied_modules = nn.ModuleDict()
        self.tied_weight_attrs: dict[str, list[str]] = {}
        self.layer_funcs: dict[int, Any] = {}
        for s in self.stage_indices:
            for idx in range(self.parts[s], self.parts[s + 1]):
                self.layer_funcs[idx] = self._build_layer(idx)
        self.chunks = [
            StageChunk(self, s, self.parts[s], self.parts[s + 1]) for s in self.stage_indices
        ]
        self.forward_funcs = [self.layer_funcs[i] for i in sorted(self.layer_funcs)]
        first = self.stage_indices[0]
        self._local_start, self._local_stop = self.parts[first], self.parts[first + 1]
        self.to(device)
        from .tied import TiedWeights

        self.tied = TiedWeights(self)
        self.tied_comms = self.tied.comms

    # -- building ------------------------------------------------------------------------------

    def _my_stages(self) -> list[int]:
        p, r = self.num_stages, self.stage_id
        if self.stage_placement == "v":
            return [r, 2 * p - 1 - r]
        return [r + k * p for k in range(self.virtual_stages)]

    def _build_layer(self, idx: int) -> Any:
        layer = self._layer_specs[idx]
        if self.seed_layers:
            (self.seed_fn or set_random_seed)(self.base_seed + idx)
        if isinstance(layer, PipelineModule):
            raise NotImplementedError("RECURSIVE BUILD NOT YET IMPLEMENTED")
        if isinstance(layer, nn.Module):
            self.add_module(str(idx), layer)
            return layer
        if isinstance(layer, TiedLayerSpec):
            if layer.key not in self.tied_modules:
                self.tied_modules[layer.key] = layer.build()
                self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
            module = self.tied_modules[layer.key]
            return (
                module if layer.forward_fn is None else functools.partial(layer.forward_fn, module)
            )
        if isinstance(layer, LayerSpec):
            module = layer.build()
            self.add_module(str(idx), module)
            return module
        return layer  # a plain callable (e.g. a lambda)

    def _build_all(self) -> list[Any]:
        """Every layer, freshly built (for profiling on one rank)."""
        tied: dict[str, nn.Module] = {}
        funcs: list[Any] = []
        for layer in self._layer_specs:
            if isinstance(layer, TiedLayerSpec):
                module = tied.setdefault(layer.key, layer.build())
                funcs.append(
                    module
                    if layer.forward_fn is None
                    else functools.partial(layer.forward_fn, module)
                )
            elif isinstance(layer, LayerSpec):
                funcs.append(layer.build())
            else:
                funcs.append(layer)
        device = next((p.device for p in self.parameters()), torch.device("cpu"))
        for fn in funcs:
            if isinstance(fn, nn.Module):
                fn.to(device)
        return funcs

    def checkpointable(self, funcs: list[Any]) -> bool:
        """DeepSpeed's ``_is_checkpointable``: named classes, else any layer with parameters."""
        if self.checkpointable_layers is not None:
            return all(type(f).__name__ in self.checkpointable_layers for f in funcs)
        return any(
            isinstance(f, nn.Module) and next(f.parameters(), None) is not None for f in funcs
        )

    # -- DeepSpeed's accessors -----------------------------------------------------------------

    def forward(self, forward_input: Any) -> Any:
        """The local layers in order (all of the model when there is one stage)."""
        x = forward_input
        for chunk in self.chunks:
            x = chunk(*(x if isinstance(x, tuple) else (x,)))
        return x

    def partitions(self) -> list[int]:
        return self.parts

    def stage_owner(self, layer_idx: int) -> int:
        """The pipeline rank (stage id) that holds layer ``layer_idx``."""
        if not 0 <= layer_idx < self._num_layers:
            raise ValueError(f"layer {layer_idx} out of range [0, {self._num_layers})")
        for chunk in range(self.total_chunks):
            if self.parts[chunk] <= layer_idx < self.parts[chunk + 1]:
                return self.chunk_owner(chunk)
        raise RuntimeError(f"Layer {layer_idx} not owned? parts={self.parts}")

    def chunk_owner(self, chunk: int) -> int:
        p = self.num_stages
        if self.stage_placement == "v":
            return chunk if chunk < p else 2 * p - 1 - chunk
        return chunk % p

    def topology(self) -> ProcessTopology:
        return self._topo

    def mpu(self) -> Any:
        return self._grid

    def num_pipeline_stages(self) -> int:
        return self.num_stages

    def set_checkpoint_interval(self, interval: int) -> None:
        if interval < 0:
            raise ValueError(f"activation checkpoint interval must be >= 0, got {interval}")
        self.activation_checkpoint_interval = interval

    def allreduce_tied_weight_gradients(self) -> None:
        """All-reduce the gradients of tied weights over the stages that hold them."""
        self.tied.allreduce_grads()

    def get_tied_weights_and_groups(self) -> list[tuple[torch.Tensor, Any]]:
        return self.tied.weights_and_groups()

    def get_additional_losses(self) -> dict[str, torch.Tensor] | None:
        return None
