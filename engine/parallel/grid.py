"""DeepSpeed's ``PipelineParallelGrid`` (the ``mpu`` a PipelineModule hands the engine), over a
:class:`~.mesh.ParallelMesh`.

DeepSpeed's words: *data parallel* = replicas of one stage and tensor shard (``dp``); *pipe
parallel* = the stages of one replica (``pp``); *slice parallel* / *tensor model parallel* =
the tensor shards (``tp``); *model parallel* = every rank of one data-parallel replica
(pp x tp), the group over which gradient norms and overflow flags are agreed.
"""

from __future__ import annotations

from typing import Any

from .mesh import ParallelMesh


class PipelineGrid:
    """The Megatron/DeepSpeed ``mpu`` interface of a mesh."""

    def __init__(self, mesh: ParallelMesh) -> None:
        self.mesh = mesh
        self._topo = mesh.topology
        self.global_rank = mesh.rank
        c = mesh.coords
        self.data_parallel_size, self.pipe_parallel_size = c.dp_size, c.pp_size
        self.slice_parallel_size = c.tp_size
        self.model_parallel_size = c.pp_size * c.tp_size
        self.data_parallel_id, self.stage_id = c.dp, c.pp
        self.pp_group = mesh.ranks("pp")
        self.dp_group = mesh.ranks("dp")

    def topology(self) -> Any:
        return self._topo

    def get_global_rank(self) -> int:
        return self.global_rank

    def get_stage_id(self) -> int:
        return self.stage_id

    def get_data_parallel_id(self) -> int:
        return self.data_parallel_id

    def stage_to_global(self, stage_id: int, **kwargs: int) -> int:
        """Global rank of ``stage_id`` at this rank's other coordinates (or those given)."""
        coord = self._topo.get_coord(self.global_rank)._asdict()
        coord.update(pipe=stage_id, **kwargs)
        return int(self._topo.get_rank(**coord))

    # pipeline
    def get_pipe_parallel_rank(self) -> int:
        return self.stage_id

    get_pipeline_model_parallel_rank = get_pipe_parallel_rank

    def get_pipe_parallel_world_size(self) -> int:
        return self.pipe_parallel_size

    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_pipe_parallel_group(self) -> Any:
        return self.mesh.group("pp")

    # data
    def get_data_parallel_rank(self) -> int:
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        return self.data_parallel_size

    def get_data_parallel_group(self) -> Any:
        return self.mesh.group("dp")

    def get_data_parallel_group_ranks(self) -> list[int]:
        return self.dp_group

    # model = pipe x tensor of one replica
    def get_model_parallel_rank(self) -> int:
        c = self.mesh.coords
        return c.pp * c.tp_size + c.tp

    def get_model_parallel_world_size(self) -> int:
        return self.model_parallel_size

    def get_model_parallel_group(self) -> Any:
        return self.mesh.model_parallel_group

    # tensor (slice)
    def get_slice_parallel_rank(self) -> int:
        return self.mesh.coords.tp

    get_tensor_model_parallel_rank = get_slice_parallel_rank

    def get_slice_parallel_world_size(self) -> int:
        return self.slice_parallel_size

    get_tensor_model_parallel_world_size = get_slice_parallel_world_size

    def get_slice_parallel_group(self) -> Any:
        return self.mesh.group("tp")

    get_tensor_model_parallel_group = get_slice_parallel_group
