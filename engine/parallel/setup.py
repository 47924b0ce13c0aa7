"""What ``initialize`` does differently for a model-parallel job, in the order it needs it:

1. :func:`plan_parallel` (before the config is read, which needs the data-parallel size): the
   layout comes from a PipelineModule (its topology), from ``tensor_parallel.autotp_size``, or
   from a Megatron-style ``mpu``; ``None`` for plain data parallelism;
2. :meth:`ParallelContext.prepare_model`: tensor-parallel plans applied (after the dtype cast);
3. :meth:`ParallelContext.split_groups`: each optimizer group split into the parameters whose
   gradients this rank counts in the global norm and those it leaves to another rank of its
   replica (replicated over tensor shards, or tied to an earlier stage);
4. :meth:`ParallelContext.strategy_groups`: DTensor parameters handed to the ZeRO strategy as
   their local shards;
5. :meth:`ParallelContext.engine_class`: PipelineEngine for a PipelineModule, else ParallelEngine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from zeroscope.agent.api import Telemetry
from zeroscope.engine.config import ConfigError, DeepSpeedConfig, read_raw
from zeroscope.engine.config_parse import read_block
from zeroscope.engine.process_group import Comm

from .config import TensorParallelConfig
from .mesh import GroupComm, MeshCoords, ParallelMesh
from .tensor_parallel import LocalParam, apply_tensor_parallel, is_sharded, resolve_plan


@dataclass(kw_only=True)
class ParallelContext:
    """This rank's place in the job and the groups the engine uses."""

    coords: MeshCoords
    dp_comm: Comm
    mp_comm: Comm
    """Every rank of this data-parallel replica (pp x tp): norm and overflow agreement."""
    tel: Telemetry
    mesh: ParallelMesh | None = None
    mpu: Any = None
    pipeline: Any = None
    user_mpu: bool = False
    uncounted_groups: set[int] = field(default_factory=set)
    _proxies: dict[int, LocalParam] = field(default_factory=dict)

    # -- 2. tensor parallel ------------------------------------------------------------------

    def prepare_model(
        self, model: nn.Module, cfg: DeepSpeedConfig, model_parameters: Any, optimizer: Any
    ) -> Any:
        """Apply the tensor-parallel plan; returns ``model_parameters`` with the parallelized
        modules' new Parameters in place of the old (a client optimizer's groups likewise)."""
        if self.user_mpu or self.coords.tp_size == 1:
            return model_parameters
        if cfg.zero_optimization.stage == 3:
            raise ConfigError(
                "ZeRO stage 3 with tensor parallelism is not supported (stage 3 shards whole "
                "parameters; use stage 1 or 2 with tensor_parallel)"
            )
        assert self.mesh is not None and self.mesh.device_mesh is not None
        plan = resolve_plan(model, cfg.tensor_parallel.partition_config)
        remap = apply_tensor_parallel(model, self.mesh.device_mesh["tp"], plan)
        from .tp_probe import install_tp_probe

        install_tp_probe(self.coords.tp_size)
        if optimizer is not None:
            for group in optimizer.param_groups:
                group["params"] = [remap.get(id(p), p) for p in group["params"]]
        if model_parameters is None:
            return None
        items = list(model_parameters)
        if items and isinstance(items[0], Mapping):
            return [{**g, "params": [remap.get(id(p), p) for p in g["params"]]} for g in items]
        return [remap.get(id(p), p) for p in items]

    # -- 3. who counts which gradient in the global norm -------------------------------------

    def counted(self, p: torch.Tensor) -> bool:
        """Does this rank's copy of ``p`` enter the replica's gradient norm?"""
        if getattr(p, "ds_pipe_replicated", False):
            return False
        if self.user_mpu:  # Megatron marks its split parameters; DTensors say it themselves
            split = getattr(p, "tensor_model_parallel", False)
            split = split or getattr(p, "model_parallel", False) or is_sharded(p)
            return bool(split) or self.coords.tp == 0
        return self.coords.tp_size == 1 or is_sharded(p) or self.coords.tp == 0

    def split_groups(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for g in groups:
            mine = [p for p in g["params"] if self.counted(p)]
            others = [p for p in g["params"] if not self.counted(p)]
            if mine:
                out.append({**g, "params": mine})
            if others:
                self.uncounted_groups.add(len(out))
                out.append({**g, "params": others})
        return out

    # -- 4. the strategy's view of DTensors --------------------------------------------------

    def strategy_groups(self, groups: list[list[Any]]) -> list[list[Any]]:
        from torch.distributed.tensor import DTensor

        def local(p: Any) -> Any:
            if not isinstance(p, DTensor):
                return p
            return self._proxies.setdefault(id(p), LocalParam(p))

        return [[local(p) for p in g] for g in groups]

    # -- 5. ----------------------------------------------------------------------------------

    def engine_class(self) -> type:
        if self.pipeline is not None:
            from .pipe_engine import PipelineEngine

            return PipelineEngine
        from .parallel_engine import ParallelEngine

        return ParallelEngine


def _group_comm(tel: Telemetry, group: Any, device: torch.device) -> GroupComm:
    return GroupComm(
        tel=tel,
        group=group,
        rank=dist.get_rank(group),
        world_size=dist.get_world_size(group),
        device=device,
    )


def _from_mpu(mpu: Any, tel: Telemetry, device: torch.device) -> ParallelContext:
    """A Megatron-style ``mpu``: its data-parallel group for ZeRO, its model-parallel group
    for the norm (DeepSpeed's engine reads the same two)."""
    dp = _group_comm(tel, mpu.get_data_parallel_group(), device)
    mp = _group_comm(tel, mpu.get_model_parallel_group(), device)
    pp_size = getattr(mpu, "get_pipe_parallel_world_size", lambda: 1)()
    coords = MeshCoords(
        dp=dp.rank,
        tp=mp.rank,
        dp_size=dp.world_size,
        tp_size=mp.world_size,
        pp=getattr(mpu, "get_pipe_parallel_rank", lambda: 0)(),
        pp_size=pp_size,
    )
    return ParallelContext(coords=coords, dp_comm=dp, mp_comm=mp, tel=tel, mpu=mpu, user_mpu=True)


def plan_parallel(
    model: nn.Module, config: Any, mpu: Any, tel: Telemetry, device: torch.device
) -> ParallelContext | None:
    """The job's parallel layout (see the module docstring), or None for plain DP."""
    from .grid import PipelineGrid
    from .pipe_module import PipelineModule

    raw = read_raw(config) if isinstance(config, str | os.PathLike | Mapping) else {}
    tp = read_block(TensorParallelConfig, raw.get("tensor_parallel") or {}, "tensor_parallel").size
    pipeline = model if isinstance(model, PipelineModule) else None
    if mpu is not None:
        if pipeline is not None or tp > 1:
            raise ConfigError("mpu= cannot be combined with a PipelineModule or tensor_parallel")
        return _from_mpu(mpu, tel, device)
    if pipeline is not None:
        mesh = pipeline.mesh
        if tp > 1 and tp != mesh.coords.tp_size:
            raise ConfigError(
                f"tensor_parallel.autotp_size={tp} but the PipelineModule's topology has "
                f"{mesh.coords.tp_size} model-parallel ranks"
            )
    elif tp > 1:
        world = dist.get_world_size() if dist.is_initialized() else 1
        if world % tp:
            raise ConfigError(f"tensor_parallel.autotp_size={tp} does not divide {world} ranks")
        mesh = ParallelMesh.from_sizes(pp=1, dp=world // tp, tp=tp, device_type=device.type)
    else:
        return None
    return ParallelContext(
        coords=mesh.coords,
        dp_comm=mesh.comm("dp", tel, device),
        mp_comm=_group_comm(tel, mesh.model_parallel_group, device)
        if mesh.model_parallel_group is not None
        else Comm(tel=tel, device=device),
        tel=tel,
        mesh=mesh,
        mpu=PipelineGrid(mesh),
        pipeline=pipeline,
    )
