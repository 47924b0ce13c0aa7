"""Stage 3 parameter partitioning: flat padded shards, all-gather and release.

Every parameter is flattened and padded to a multiple of the data-parallel world size N; rank r
keeps elements ``[r*s, (r+1)*s)`` (``s = padded / N``) in one flat buffer holding all of its
shards back to back. Between uses the module's parameter is an empty placeholder
(``param.data = torch.empty(0)``), exactly as DeepSpeed's ``partition_parameters.py`` does with
``ds_tensor`` / ``ds_status``: the Parameter object (and so the optimizer's and autograd's
references to it) survives while its storage comes and goes.

Small parameters (``numel <= stage3_param_persistence_threshold``, while their total stays
within ``stage3_model_persistence_threshold``) are *persistent*: they keep
their full tensor at all times (no gather in forward or backward), but their gradient and
optimizer state are still sharded like every other parameter's, and the full tensor is
refreshed by one all-gather after each optimizer step (DeepSpeed stage3.py ``_post_step``).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from zeroscope.agent.api import Telemetry, Waitable

from .zero_init import forget, full_shape, is_zero_init_param, next_param_id

# torch >= 2.13 names it all_gather_single; older releases only have all_gather_into_tensor.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CommLike(Protocol):
    """What stage 3 needs of the engine's data-parallel ``Comm``: group, rank, size, reporter."""

    tel: Telemetry
    group: Any
    rank: int
    world_size: int
    device: torch.device
    force: bool

    def broadcast(self, tensor: torch.Tensor, *, src: int, label: str) -> Waitable: ...


class Done:
    """The handle of a collective that did not need to run (one rank)."""

    def wait(self) -> bool:
        return True


class ParamStatus(enum.Enum):
    """DeepSpeed's ZeroParamStatus: where a parameter's full data is right now."""

    NOT_AVAILABLE = "not_available"
    INFLIGHT = "inflight"
    AVAILABLE = "available"


@dataclass(eq=False, slots=True)
class ShardedParam:
    """One parameter's place in the partition (DeepSpeed's ``ds_*`` attributes)."""

    param: nn.Parameter
    name: str
    index: int
    shape: torch.Size
    numel: int
    shard_numel: int
    offset: int
    """Start of this parameter's shard in the rank's flat shard buffers."""
    world_size: int
    persistent: bool
    status: ParamStatus = ParamStatus.NOT_AVAILABLE
    active_uses: set[int] = field(default_factory=set)
    """ids of module calls currently using the full parameter; it is never released while
    one is running (tied weights, nested modules, modules called twice)."""

    @property
    def padded_numel(self) -> int:
        """Elements of the full parameter after padding: what a gather holds and moves."""
        return self.shard_numel * self.world_size


def padded_shard_numel(numel: int, world_size: int) -> int:
    """Elements of one rank's shard of a ``numel``-element parameter padded to a multiple of N."""
    return math.ceil(numel / world_size)


class Gather:
    """An all-gather in flight for a batch of parameters; ``wait()`` installs their full data."""

    def __init__(self, work: Waitable, out: torch.Tensor, params: Sequence[ShardedParam]):
        self.work = work
        self.out = out
        self.params = list(params)
        self.done = False

    def wait(self) -> None:
        if self.done:
            return
        self.work.wait()
        columns = self.out.view(self.params[0].world_size, -1)
        col = 0
        for sp in self.params:
            full = columns[:, col : col + sp.shard_numel]
            if sp.persistent:  # refresh in place: the persistent tensor is never freed
                sp.param.data.view(-1).copy_(full.reshape(-1)[: sp.numel])
            else:
                # One parameter alone is a contiguous view (no copy); a batch is copied out
                # per parameter so each can be released on its own.
                sp.param.data = full.reshape(-1)[: sp.numel].view(sp.shape)
            sp.status = ParamStatus.AVAILABLE
            col += sp.shard_numel
        self.done = True


class Partition:
    """The rank's shards of ``named_params`` (in that order) and the primitives to move them.

    ``shards`` is the flat 16-bit (or fp32) buffer of this rank's 1/N of all parameters: P.
    """

    def __init__(
        self,
        named_params: Sequence[tuple[str, nn.Parameter]],
        *,
        dtype: torch.dtype,
        persistence_threshold: int,
        comm: CommLike,
        model_persistence_threshold: int = 2**63 - 1,
    ) -> None:
        self.comm = comm
        self.group = comm.group
        self.world_size = comm.world_size
        self.rank = comm.rank
        self.device = comm.device
        """Where the shards, gathers and placeholders live (the engine's device)."""
        self.skip_collectives = comm.world_size == 1 and not comm.force
        self.dtype = dtype
        self.telemetry = comm.tel
        self.params: list[ShardedParam] = []
        self.by_param: dict[nn.Parameter, ShardedParam] = {}
        offset = persistent_total = 0
        # A tied parameter comes once (named_parameters() dedupes): it is partitioned once.
        for index, (name, param) in enumerate(named_params):
            shape = full_shape(param)
            numel = shape.numel()
            s = padded_shard_numel(numel, self.world_size)
            sp = ShardedParam(
                param=param,
                name=name,
                index=index,
                shape=shape,
                numel=numel,
                shard_numel=s,
                offset=offset,
                world_size=self.world_size,
                persistent=numel <= persistence_threshold
                and persistent_total + numel <= model_persistence_threshold,
            )
            self.params.append(sp)
            self.by_param[param] = sp
            persistent_total += numel if sp.persistent else 0
            offset += s
        self.shards = torch.zeros(offset, dtype=dtype, device=self.device)
        self._partition_initial_values()

    def _partition_initial_values(self) -> None:
        """Broadcast rank 0's initial values (ranks may have built different random inits, as
        DeepSpeed's _broadcast_model), keep this rank's slice of each parameter, and free the
        full tensors of the non-persistent ones. One parameter at a time, in place: the device
        never holds a second full copy of the model (a flat copy of every parameter would
        double the model's footprint at the worst moment, before anything is sharded).
        Parameters that ``zero.Init`` partitioned already are adopted as they are
        (zero/stage3/zero_init.py)."""
        for sp in self.params:
            sp.param.ds_id = getattr(sp.param, "ds_id", None) or next_param_id()  # type: ignore[attr-defined]
            sp.param.ds_numel, sp.param.ds_shape = sp.numel, sp.shape  # type: ignore[attr-defined]
        adopted = [sp for sp in self.params if is_zero_init_param(sp.param)]
        fresh = [sp for sp in self.params if not is_zero_init_param(sp.param)]
        if adopted:
            self._adopt(adopted)
        for sp in fresh:
            full = sp.param.detach()
            if full.dtype != self.dtype or full.device != self.device or not full.is_contiguous():
                full = full.to(
                    device=self.device, dtype=self.dtype, memory_format=torch.contiguous_format
                )
            full = full.reshape(-1)
            if not self.skip_collectives:
                self.comm.broadcast(full, src=0, label="stage3 init").wait()
            self.shard_of(sp).copy_(self._slice_of_rank(full, sp))
            if sp.persistent:
                sp.param.data = full.view(sp.shape)
                sp.status = ParamStatus.AVAILABLE
            else:
                sp.param.data = self._placeholder()
                sp.status = ParamStatus.NOT_AVAILABLE

    def _adopt(self, adopted: list[ShardedParam]) -> None:
        """Take over ``zero.Init`` shards (same layout: ``ceil(numel/N)`` per rank, padded at
        the end); persistent ones get their full tensor back with one all-gather."""
        for sp in adopted:
            self.shard_of(sp).copy_(sp.param.ds_tensor)  # type: ignore[attr-defined]
            forget(sp.param)
            sp.param.data = self._placeholder()
            sp.status = ParamStatus.NOT_AVAILABLE
        persistent = [sp for sp in adopted if sp.persistent]
        for sp in persistent:
            sp.param.data = torch.empty(sp.shape, dtype=self.dtype, device=self.device)
        if persistent:
            self.all_gather(persistent, prefetched=False).wait()

    def _placeholder(self) -> torch.Tensor:
        """What a released parameter's ``.data`` is: empty, on the engine's device."""
        return torch.empty(0, dtype=self.dtype, device=self.device)

    def _slice_of_rank(self, full: torch.Tensor, sp: ShardedParam) -> torch.Tensor:
        start = self.rank * sp.shard_numel
        piece = full[start : start + sp.shard_numel]
        if piece.numel() < sp.shard_numel:  # the last ranks hold the padding
            piece = torch.cat([piece, full.new_zeros(sp.shard_numel - piece.numel())])
        return piece

    def shard_span(self, start: int, end: int) -> torch.Tensor:
        """Elements ``[start, end)`` of the flat shard buffer (offload_param overrides this and
        ``shard_of`` to bring the shards in from host memory or NVMe: engine/offload_param.py)."""
        return self.shards[start:end]

    def shard_of(self, sp: ShardedParam) -> torch.Tensor:
        return self.shards[sp.offset : sp.offset + sp.shard_numel]

    # -- collectives -------------------------------------------------------------------------

    def all_gather(self, params: Sequence[ShardedParam], *, prefetched: bool) -> Gather:
        """Issue one all-gather for ``params`` (DeepSpeed's all_gather_coalesced); returns at
        once. nbytes is the full gathered (padded) size, the nccl-tests convention."""
        adjacent = all(b.offset == a.offset + a.shard_numel for a, b in itertools.pairwise(params))
        if adjacent:  # one view of the flat shard buffer, no copy (the common case)
            end = params[-1].offset + params[-1].shard_numel
            inp = self.shard_span(params[0].offset, end)
        else:
            inp = torch.cat([self.shard_of(sp) for sp in params])
        out = torch.empty(inp.numel() * self.world_size, dtype=self.dtype, device=self.device)
        work: Waitable
        if self.skip_collectives:
            out.copy_(inp)
            work = Done()
        else:
            work = _all_gather(out, inp, group=self.group, async_op=True)
        for sp in params:
            sp.status = ParamStatus.INFLIGHT
        if (
            self.skip_collectives
        ):  # nothing crossed a link: nothing to report (as engine/process_group.py)
            return Gather(work, out, params)
        tracked = self.telemetry.collective(
            work,
            op="all_gather",
            nbytes=out.numel() * out.element_size(),
            group_size=self.world_size,
            prefetched=prefetched,
            label=params[0].name if len(params) == 1 else f"{params[0].name}+{len(params) - 1}",
        )
        return Gather(tracked, out, params)

    def release(self, sp: ShardedParam) -> None:
        """Drop the full data of a gathered parameter; the shard stays (DeepSpeed partition())."""
        assert not sp.persistent, "persistent parameters are never released"
        sp.param.data = self._placeholder()
        sp.status = ParamStatus.NOT_AVAILABLE

    def refresh_persistent(self) -> None:
        """After an optimizer step: all-gather the updated shards of the persistent parameters
        into their full tensors (DeepSpeed stage3.py ``_post_step``)."""
        persistent = [sp for sp in self.params if sp.persistent]
        if not persistent:
            return
        gather = self.all_gather(persistent, prefetched=False)
        gather.wait()

    # -- accounting --------------------------------------------------------------------------

    @property
    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype, device="cpu").element_size()

    @property
    def persistent_bytes(self) -> int:
        """Full tensors of persistent parameters (held on top of their shards)."""
        return sum(sp.numel for sp in self.params if sp.persistent) * self.element_size

    @property
    def shard_bytes(self) -> int:
        return self.shards.numel() * self.element_size
