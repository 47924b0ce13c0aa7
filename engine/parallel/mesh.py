"""The job's rank grid as a ``torch.distributed.device_mesh.DeviceMesh`` with named axes ``pp``,
``dp`` and ``tp`` (picotron's one line: ``torch.arange(world).view(pp, dp, tp)``).

The layout is DeepSpeed's (topology.py): tensor-parallel ranks adjacent, then data parallel, then
pipeline stages. Every rank builds the same mesh (DeviceMesh creates one process group per axis
slice, collectively), plus one "model-parallel" group per data-parallel replica (its pp x tp
ranks), over which the global gradient norm and the fp16 overflow flag are agreed.

The ZeRO strategies get a :class:`GroupComm` over the ``dp`` group only: they partition and reduce
over the replicas of *this* stage and *this* tensor shard, never over the whole world.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zeroscope.agent.api import Telemetry, Waitable
from zeroscope.engine.process_group import Comm

from .topology import AXIS_TO_MESH, ProcessTopology

MESH_AXES = ("pp", "dp", "tp")


class _Done:
    def wait(self) -> bool:
        return True


@dataclass(slots=True)
class GroupComm(Comm):
    """:class:`~zeroscope.engine.process_group.Comm` over a sub-group: ``rank`` is the group rank
    and a broadcast's ``src`` is a group rank too (``group_src``), so rank 0 of each data-parallel
    group seeds its own replicas."""

    def broadcast(self, tensor: torch.Tensor, *, src: int, label: str) -> Waitable:
        if self.world_size == 1:
            return _Done()
        work = dist.broadcast(tensor, group_src=src, group=self.group, async_op=True)
        return self._report(work, "broadcast", tensor.numel() * tensor.element_size(), label)


@dataclass(frozen=True, slots=True)
class MeshCoords:
    """Where this rank sits: its coordinate and the size of each axis."""

    dp: int = 0
    pp: int = 0
    tp: int = 0
    dp_size: int = 1
    pp_size: int = 1
    tp_size: int = 1

    def role(self) -> str:
        """One line for headers, e.g. ``stage 1/2 · tp 0/2 · dp 1/2``."""
        return (
            f"stage {self.pp}/{self.pp_size} · tp {self.tp}/{self.tp_size} · "
            f"dp {self.dp}/{self.dp_size}"
        )


class ParallelMesh:
    """The DeviceMesh, this rank's coordinates and the groups the engine needs."""

    def __init__(self, topology: ProcessTopology, device_type: str) -> None:
        self.topology = topology
        world = topology.world_size()
        initialized = dist.is_available() and dist.is_initialized()
        actual = dist.get_world_size() if initialized else 1
        if world != actual:
            raise ValueError(
                f"the parallel layout {dict(zip(topology.axes, topology.dims))} needs {world} "
                f"ranks, the job has {actual}"
            )
        self.rank = dist.get_rank() if initialized else 0
        coord = topology.get_coord(self.rank)
        sizes = {AXIS_TO_MESH.get(a, a): d for a, d in zip(topology.axes, topology.dims)}
        at = {AXIS_TO_MESH.get(a, a): getattr(coord, a) for a in topology.axes}
        self.coords = MeshCoords(
            dp=at.get("dp", 0),
            pp=at.get("pp", 0),
            tp=at.get("tp", 0),
            dp_size=sizes.get("dp", 1),
            pp_size=sizes.get("pp", 1),
            tp_size=sizes.get("tp", 1),
        )
        self.device_mesh: Any = None
        self._groups: dict[str, Any] = {}
        self.model_parallel_group: Any = None
        if not initialized:
            return
        from torch.distributed.device_mesh import init_device_mesh

        names = [AXIS_TO_MESH.get(a, a) for a in topology.axes]
        dims = list(topology.dims)
        for axis in MESH_AXES:  # every mesh names all three axes (size 1 where unused)
            if axis not in names:
                names.append(axis)
                dims.append(1)
        self.device_mesh = init_device_mesh(device_type, tuple(dims), mesh_dim_names=tuple(names))
        self._groups = {axis: self.device_mesh.get_group(axis) for axis in MESH_AXES}
        data_axis = "data" if "data" in topology.axes else None
        replicas = (
            [topology.filter_match(**{data_axis: d}) for d in range(topology.get_dim(data_axis))]
            if data_axis
            else [list(range(world))]
        )
        self.model_parallel_group, _ = dist.new_subgroups_by_enumeration(replicas)

    @classmethod
    def from_sizes(cls, *, pp: int, dp: int, tp: int, device_type: str) -> ParallelMesh:
        """DeepSpeed's PipeModelDataParallelTopology layout for the given sizes."""
        return cls(ProcessTopology(axes=["pipe", "data", "model"], dims=[pp, dp, tp]), device_type)

    def group(self, axis: str) -> Any:
        """The process group of ``axis`` through this rank (None without torch.distributed)."""
        return self._groups.get(axis)

    def size(self, axis: str) -> int:
        return int(getattr(self.coords, f"{axis}_size"))

    def comm(self, axis: str, tel: Telemetry, device: torch.device) -> GroupComm:
        """A reporting Comm over ``axis``'s group (``dp`` for the ZeRO strategies), its
        buffers on ``device``."""
        return GroupComm(
            tel=tel,
            group=self.group(axis),
            rank=int(getattr(self.coords, axis)),
            world_size=self.size(axis),
            device=device,
        )

    def ranks(self, axis: str) -> list[int]:
        """Global ranks of this rank's ``axis`` group, in group-rank order."""
        group = self.group(axis)
        return [self.rank] if group is None else dist.get_process_group_ranks(group)
