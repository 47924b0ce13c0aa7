"""Process groups and the engine's collectives, each reported to the agent in this one place.

Every collective is issued with ``async_op=True`` and wrapped by ``Telemetry.collective`` so its
issue-to-completion time and the part the loop waited for are measured without synchronizing
the device. ``nbytes`` follows nccl-tests: the full (gathered) size for all-gather and
reduce-scatter, the buffer size for all-reduce.

Process groups: torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR...) initializes
torch.distributed with nccl on CUDA and gloo on CPU; a plain ``python train.py`` with no such
environment runs as one rank without any process group (collectives become no-ops).

World 1: every collective is skipped at one rank (there is nothing to exchange), which also means
one GPU never exercises NCCL or the agent's collective timing. ``ZEROSCOPE_WORLD1_COLLECTIVES=1``
forces the real collectives at world 1 (initializing a one-rank process group when torchrun gave
none); the numbers are the same, since a sum over one rank is the tensor itself.

Devices: rank ``LOCAL_RANK`` uses GPU ``LOCAL_RANK`` and the process group is bound to it
(``init_process_group(device_id=...)``). More local ranks than visible GPUs with every rank seeing
the same GPUs (``CUDA_VISIBLE_DEVICES`` unset: the 2-rank demo on a 1-GPU machine) stop before any
work with one line saying what to do (:class:`TooFewGpus`): NCCL refuses two ranks on one GPU
("Duplicate GPU detected"), and a job quietly moved to the CPU would hide the mistake behind a
hundredfold slowdown. Every local rank stops (``LOCAL_WORLD_SIZE`` is compared, not only the
rank's own index), so none is left waiting in ``init_process_group`` for a peer that never comes.
A launcher that narrows each rank's ``CUDA_VISIBLE_DEVICES`` (one GPU per rank, as SLURM's
``--gpus-per-task``) is the one case where fewer visible GPUs than local ranks is right: there
rank ``LOCAL_RANK`` uses ``LOCAL_RANK % device_count`` of its own set, said once.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from zeroscope.agent.api import Telemetry, Waitable
from zeroscope.agent.schema import CollectiveOp


class _Done:
    """The handle of a collective that did not need to run (one rank)."""

    def wait(self) -> bool:
        return True


log = logging.getLogger("zeroscope.engine")

WORLD1_COLLECTIVES_ENV = "ZEROSCOPE_WORLD1_COLLECTIVES"
"""Set to 1 to issue the engine's collectives at world size 1 too (see the module docstring)."""


def force_collectives() -> bool:
    """True when ``ZEROSCOPE_WORLD1_COLLECTIVES`` asks for real collectives at world 1."""
    return os.environ.get(WORLD1_COLLECTIVES_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def init_distributed(device: torch.device, backend: str | None = None) -> None:
    """Initialize torch.distributed from torchrun's environment, once (nccl on CUDA, gloo on the
    CPU, unless ``backend``), an NCCL group bound to ``device``. Without torchrun's environment, a
    one-rank group (in-process store) only when world-1 collectives are forced."""
    if not dist.is_available() or dist.is_initialized():
        return
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        # torch's Flight Recorder and NCCL's per-collective timing must be on before the group
        # exists: the agent reads each collective's device duration there (on the CPU the
        # host's clock times it, and the recorder is left off).
        from zeroscope.agent.attach.flight_recorder import configure_environment

        configure_environment()
    # Bound to the rank's GPU for NCCL (eager communicator, no guessing from the current device).
    nccl = device.type == "cuda" and "nccl" in backend
    bound: dict[str, Any] = {"device_id": device} if nccl else {}
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend, **bound)
    elif force_collectives():
        dist.init_process_group(
            backend=backend, store=dist.HashStore(), rank=0, world_size=1, **bound
        )


class TooFewGpus(RuntimeError):
    """More local ranks than visible GPUs: raised by :func:`pick_device` before any work."""


_warned_narrowed = False


def pick_device() -> torch.device:
    """``cuda:LOCAL_RANK`` when CUDA is available (made the current device), else the CPU.
    Raises :class:`TooFewGpus`, on every local rank, when this node runs more ranks than the
    GPUs they all see (see the module docstring for a launcher's per-rank narrowing)."""
    global _warned_narrowed
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    ranks = max(local_rank + 1, int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0))
    count = torch.cuda.device_count()
    index = local_rank
    if ranks > count:
        if os.environ.get("CUDA_VISIBLE_DEVICES") is None:
            raise TooFewGpus(
                f"{ranks} ranks on this node but {count} visible GPU(s): launch at most {count} "
                f"per node (--nproc-per-node {count}), or hide the GPUs (CUDA_VISIBLE_DEVICES=) "
                "to train every rank on the CPU with gloo"
            )
        index = local_rank % count
        if not _warned_narrowed:
            _warned_narrowed = True
            log.warning(
                "LOCAL_RANK %d sees %d GPU(s) (CUDA_VISIBLE_DEVICES=%s): using cuda:%d, "
                "assuming the launcher gave each rank its own",
                local_rank,
                count,
                os.environ["CUDA_VISIBLE_DEVICES"],
                index,
            )
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


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
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the engine's tensors and so its collectives' buffers live."""
    force: bool = False
    """Issue collectives even at world size 1 (``ZEROSCOPE_WORLD1_COLLECTIVES``)."""

    @classmethod
    def data_parallel(cls, tel: Telemetry, device: torch.device | None = None) -> Comm:
        """All ranks of the job (the whole world is the data-parallel group here)."""
        where = torch.device("cpu") if device is None else device
        if dist.is_available() and dist.is_initialized():
            return cls(
                tel=tel,
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                device=where,
                force=force_collectives(),
            )
        return cls(tel=tel, device=where)

    @property
    def skip(self) -> bool:
        """True when collectives are skipped: one rank and no forced world-1 collectives."""
        return self.world_size == 1 and not self.force

    def _report(self, work: Any, op: CollectiveOp, nbytes: int, label: str) -> Waitable:
        return self.tel.collective(
            work, op=op, nbytes=nbytes, group_size=self.world_size, label=label
        )

    def all_reduce(
        self, tensor: torch.Tensor, *, label: str, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> Waitable:
        """In-place all-reduce (SUM unless told)."""
        if self.skip:
            return _Done()
        work = dist.all_reduce(tensor, op=op, group=self.group, async_op=True)
        return self._report(work, "all_reduce", tensor.numel() * tensor.element_size(), label)

    def broadcast(self, tensor: torch.Tensor, *, src: int, label: str) -> Waitable:
        """In-place broadcast of ``tensor`` from rank ``src``."""
        if self.skip:
            return _Done()
        work = dist.broadcast(tensor, src=src, group=self.group, async_op=True)
        return self._report(work, "broadcast", tensor.numel() * tensor.element_size(), label)

    def reduce_scatter(self, output: torch.Tensor, full: torch.Tensor, *, label: str) -> Waitable:
        """Sum ``full`` over ranks; this rank receives its 1/N chunk in ``output`` (which may be
        that chunk of ``full`` itself: in place)."""
        if self.skip:
            if output.data_ptr() != full.data_ptr():
                output.copy_(full)
            return _Done()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            work = _REDUCE_SCATTER(output, full, group=self.group, async_op=True)
        return self._report(work, "reduce_scatter", full.numel() * full.element_size(), label)

    def all_gather(self, full: torch.Tensor, shard: torch.Tensor, *, label: str) -> Waitable:
        """Every rank's ``shard`` into ``full`` (``shard`` may be this rank's chunk of ``full``)."""
        if self.skip:
            if full.data_ptr() != shard.data_ptr():
                full.copy_(shard)
            return _Done()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            work = _ALL_GATHER(full, shard, group=self.group, async_op=True)
        return self._report(work, "all_gather", full.numel() * full.element_size(), label)
