"""Process groups and the engine's collectives, each reported to the agent in this one place.

Every collective is issued with ``async_op=True`` and wrapped by ``Telemetry.collective`` so its
issue-to-completion time and the part the loop waited for are measured without synchronizing
the device. ``nbytes`` follows nccl-tests: the full (gathered) size for all-gather and
reduce-scatter, the buffer size for all-reduce.

Process groups: torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...) initializes
torch.distributed with nccl on CUDA and gloo on CPU; a plain ``python train.py`` with no such
environment runs as one rank without any process group (collectives become no-ops).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from zeroscope.agent.api import Telemetry, Waitable
from zeroscope.agent.schema import CollectiveOp


class _Done:
    """The handle of a collective that did not need to run (one rank)."""

    def wait(self) -> bool:
        return True


def init_distributed(device: torch.device) -> None:
    """Initialize torch.distributed from torchrun's environment, once."""
    if dist.is_available() and not dist.is_initialized() and "RANK" in os.environ:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)


def pick_device() -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


# torch >= 2.10 renamed the tensor collectives (*_single) and warns on the old names; the old
# names are what torch 2.4 has.
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(slots=True)
class Comm:
    """The data-parallel group and its reported collectives."""

    tel: Telemetry
    group: Any = None
    rank: int = 0
    world_size: int = 1

    @classmethod
    def data_parallel(cls, tel: Telemetry) -> Comm:
        """All ranks of the job (the whole world is the data-parallel group here)."""
        if dist.is_available() and dist.is_initialized():
            return cls(tel=tel, rank=dist.get_rank(), world_size=dist.get_world_size())
        return cls(tel=tel)

    def _report(self, work: Any, op: CollectiveOp, nbytes: int, label: str) -> Waitable:
        return self.tel.collective(
            work, op=op, nbytes=nbytes, group_size=self.world_size, label=label
        )

    def all_reduce(
        self, tensor: torch.Tensor, *, label: str, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> Waitable:
        """In-place all-reduce (SUM unless told)."""
        if self.world_size == 1:
            return _Done()
        work = dist.all_reduce(tensor, op=op, group=self.group, async_op=True)
        return self._report(work, "all_reduce", tensor.numel() * tensor.element_size(), label)

    def broadcast(self, tensor: torch.Tensor, *, src: int, label: str) -> Waitable:
        """In-place broadcast of ``tensor`` from rank ``src``."""
        if self.world_size == 1:
            return _Done()
        work = dist.broadcast(tensor, src=src, group=self.group, async_op=True)
        return self._report(work, "broadcast", tensor.numel() * tensor.element_size(), label)

    def reduce_scatter(self, output: torch.Tensor, full: torch.Tensor, *, label: str) -> Waitable:
        """Sum ``full`` over ranks; this rank receives its 1/N chunk in ``output`` (which may be
        that chunk of ``full`` itself: in place)."""
        if self.world_size == 1:
            if output.data_ptr() != full.data_ptr():
                output.copy_(full)
            return _Done()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            work = _REDUCE_SCATTER(output, full, group=self.group, async_op=True)
        return self._report(work, "reduce_scatter", full.numel() * full.element_size(), label)

    def all_gather(self, full: torch.Tensor, shard: torch.Tensor, *, label: str) -> Waitable:
        """Every rank's ``shard`` into ``full`` (``shard`` may be this rank's chunk of ``full``)."""
        if self.world_size == 1:
            if full.data_ptr() != shard.data_ptr():
                full.copy_(shard)
            return _Done()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            work = _ALL_GATHER(full, shard, group=self.group, async_op=True)
        return self._report(work, "all_gather", full.numel() * full.element_size(), label)
