"""``deepspeed.comm``: DeepSpeed's collective API (deepspeed/comm/comm.py), over torch.distributed.

Same names and signatures as DeepSpeed, so ``from deepspeed import comm as dist`` code runs
unchanged; DeepSpeed's logging keywords (``prof``, ``log_name``, ``debug``) are accepted and
dropped (zeroscope's agent times the engine's own collectives; these are the user's).

One difference on purpose: without a process group (a plain ``python train.py``, which the engine
runs as one rank) ``get_rank()`` is 0, ``get_world_size()`` is 1 and every collective leaves its
tensors as a one-rank job would, where DeepSpeed asserts that its backend is initialized.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

__all__ = [
    "ReduceOp",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "get_global_rank",
    "get_local_rank",
    "get_rank",
    "get_world_group",
    "get_world_size",
    "init_distributed",  # noqa: F822 (resolved by __getattr__: it lives in zeroscope.engine.api)
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "log_summary",
    "monitored_barrier",
    "new_group",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
]


def _one_rank() -> bool:
    return not (dist.is_available() and dist.is_initialized())


class _Done:
    """What an ``async_op=True`` collective returns when there is nothing to wait for."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _result(async_op: bool) -> Any:
    return _Done() if async_op else None


# -- process group ------------------------------------------------------------------------------


def __getattr__(name: str) -> Any:
    if name == "init_distributed":  # DeepSpeed's, the same function as deepspeed.init_distributed
        from zeroscope.engine.api import init_distributed

        return init_distributed
    raise AttributeError(f"module 'deepspeed.comm' (zeroscope's engine) has no attribute {name!r}")


def is_available() -> bool:
    return dist.is_available()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_process_group(group: Any = None) -> None:
    if not _one_rank():
        dist.destroy_process_group(group)


def new_group(ranks: list[int]) -> Any:
    return None if _one_rank() else dist.new_group(ranks)


def get_world_group() -> Any:
    return None if _one_rank() else dist.group.WORLD


def get_rank(group: Any = None) -> int:
    return 0 if _one_rank() else dist.get_rank(group)


def get_world_size(group: Any = None) -> int:
    return 1 if _one_rank() else dist.get_world_size(group)


def get_local_rank() -> int:
    """torchrun's LOCAL_RANK (DeepSpeed reads the launcher's variable too)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def get_global_rank(group: Any = None, group_rank: int = 0) -> int:
    if _one_rank() or group is None:
        return group_rank
    return dist.get_global_rank(group, group_rank)


def get_all_ranks_from_group(group: Any = None) -> list[int]:
    if _one_rank():
        return [0]
    return dist.get_process_group_ranks(group or dist.group.WORLD)


# -- collectives --------------------------------------------------------------------------------


def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None, **kw: Any) -> Any:
    if _one_rank():
        return _result(async_op)
    return dist.barrier(group=group, async_op=async_op, device_ids=device_ids)


def monitored_barrier(
    group: Any = None, timeout: Any = None, wait_all_ranks: bool = False, **kw: Any
) -> Any:
    if _one_rank():
        return None
    return dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


def all_reduce(
    tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        return _result(async_op)
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        return _result(async_op)
    return dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


def broadcast(
    tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False, **kw: Any
) -> Any:
    if _one_rank():
        return _result(async_op)
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


def broadcast_object_list(
    object_list: list[Any], src: int, group: Any = None, device: Any = None, **kw: Any
) -> None:
    if not _one_rank():
        dist.broadcast_object_list(object_list, src, group=group, device=device)


def all_gather(
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        tensor_list[0].copy_(tensor)
        return _result(async_op)
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None, **kw: Any) -> None:
    if _one_rank():
        object_list[0] = obj
        return
    dist.all_gather_object(object_list, obj, group=group)


def all_gather_into_tensor(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        output_tensor.copy_(input_tensor.reshape(output_tensor.shape))
        return _result(async_op)
    return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)


allgather_fn = all_gather_into_tensor


def reduce_scatter_tensor(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        output_tensor.copy_(input_tensor.reshape(output_tensor.shape))
        return _result(async_op)
    return dist.reduce_scatter_tensor(
        output_tensor, input_tensor, op=op, group=group, async_op=async_op
    )


def reduce_scatter(
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        output.copy_(input_list[0])
        return _result(async_op)
    return dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)


def all_to_all_single(
    output: torch.Tensor,
    tensor: torch.Tensor,
    output_split_sizes: Any = None,
    input_split_sizes: Any = None,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        output.copy_(tensor)
        return _result(async_op)
    return dist.all_to_all_single(
        output, tensor, output_split_sizes, input_split_sizes, group=group, async_op=async_op
    )


def gather(
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int = 0,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        if gather_list:
            gather_list[0].copy_(tensor)
        return _result(async_op)
    return dist.gather(tensor, gather_list, dst, group=group, async_op=async_op)


def scatter(
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int = 0,
    group: Any = None,
    async_op: bool = False,
    **kw: Any,
) -> Any:
    if _one_rank():
        if scatter_list:
            tensor.copy_(scatter_list[0])
        return _result(async_op)
    return dist.scatter(tensor, scatter_list, src, group=group, async_op=async_op)


def send(tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0, **kw: Any) -> None:
    dist.send(tensor, dst, group=group, tag=tag)


def recv(
    tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, **kw: Any
) -> Any:
    return dist.recv(tensor, src, group=group, tag=tag)


def isend(tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0, **kw: Any) -> Any:
    return dist.isend(tensor, dst, group=group, tag=tag)


def irecv(
    tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0, **kw: Any
) -> Any:
    return dist.irecv(tensor, src, group=group, tag=tag)


def log_summary(show_straggler: bool = False, return_dict: bool = False) -> Any:
    """DeepSpeed's comms-logger summary: zeroscope's own collective records are in the live view
    and the trace (``zeroscope summary``), so there is nothing to print here."""
    return {} if return_dict else None
