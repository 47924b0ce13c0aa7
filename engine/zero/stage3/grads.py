"""Gradients reduce-scattered straight into the owner's shard (stage 3's G = 1/N).

Each parameter's full gradient exists only from its AccumulateGrad until this module takes it
(a post-accumulate-grad hook, which fires once per backward even for a tied weight or a module
called twice, because autograd sums all contributions before accumulating). Gradients are
bucketed up to ``reduce_bucket_size`` elements, each bucket is one reduce-scatter whose output
is this rank's slice of every parameter in it, averaged over the N ranks and added into the
flat gradient shard (added, so gradient accumulation over micro-batches just works).

With ``overlap_comm`` the reduce-scatters run while backward continues and are waited for at
the end of backward; without it each is waited for at once (DeepSpeed stage3.py
``__reduce_and_partition_ipg_grads`` / ``__avg_scatter_grads``: sum, then divide by N).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from zeroscope.agent.api import Waitable

from .partition import Done, Partition, ShardedParam

# torch >= 2.13 names it reduce_scatter_single; older releases only have reduce_scatter_tensor.
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _copy_padded(block: torch.Tensor, flat: torch.Tensor) -> None:
    """Lay ``flat`` out row by row in the (N, s) ``block``, zeros after its end (the padding)."""
    width = block.shape[1]
    full_rows, rest = divmod(flat.numel(), width)
    block[:full_rows].copy_(flat[: full_rows * width].view(full_rows, width))
    if full_rows < block.shape[0]:
        block[full_rows, :rest].copy_(flat[full_rows * width :])
        block[full_rows, rest:].zero_()
        block[full_rows + 1 :].zero_()


class GradReducer:
    """Owns G: the flat shard of every parameter's gradient on this rank."""

    def __init__(
        self,
        partition: Partition,
        *,
        bucket_numel: int,
        overlap_comm: bool,
    ) -> None:
        self.partition = partition
        self.bucket_numel = bucket_numel
        self.overlap_comm = overlap_comm
        self.telemetry = partition.telemetry
        # Frozen parameters come last in the partition and never get a gradient: G covers the
        # shards up to the last parameter that can have one (DeepSpeed keeps no gradient
        # partition for frozen parameters either).
        self._numel = max(
            (sp.offset + sp.shard_numel for sp in partition.params if sp.param.requires_grad),
            default=0,
        )
        self.grads = torch.zeros(self._numel, dtype=partition.dtype, device=partition.device)
        """G: this rank's averaged gradient shards (made again after :meth:`release`)."""
        self._bucket: list[tuple[ShardedParam, torch.Tensor]] = []
        self._bucket_size = 0
        self._pending: list[tuple[Waitable, torch.Tensor, torch.Tensor, list[ShardedParam]]] = []
        self.held = False
        """Pipeline parallel: leave gradients in ``param.grad`` until :meth:`take_held`."""
        self._handles = [
            sp.param.register_post_accumulate_grad_hook(self._take_grad)
            for sp in partition.params
            if sp.param.requires_grad
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def take_held(self) -> None:
        """Bucket the gradients accumulated while reductions were held (in backward order)."""
        for sp in reversed(self.partition.params):
            if sp.param.grad is not None:
                self._take_grad(sp.param)

    def _take_grad(self, param: nn.Parameter) -> None:
        if self.held:
            return
        sp = self.partition.by_param[param]
        grad = param.grad
        param.grad = None  # the full gradient lives no longer than its reduce-scatter input
        if grad is None:
            return
        self._bucket.append((sp, grad))
        self._bucket_size += sp.padded_numel
        if self._bucket_size >= self.bucket_numel:
            self.flush()

    def flush(self) -> None:
        """Issue one reduce-scatter for the gradients collected so far."""
        if not self._bucket:
            return
        world = self.partition.world_size
        params = [sp for sp, _ in self._bucket]
        if len(self._bucket) == 1 and params[0].numel == params[0].padded_numel:
            inp = self._bucket[0][1].reshape(-1)
        else:
            # Row r of (N, S) is what rank r owns: its slice of every gradient, side by side.
            rows = torch.empty(
                world,
                sum(sp.shard_numel for sp in params),
                dtype=self.partition.dtype,
                device=self.partition.device,
            )
            col = 0
            for sp, grad in self._bucket:
                _copy_padded(rows[:, col : col + sp.shard_numel], grad.reshape(-1))
                col += sp.shard_numel
            inp = rows.view(-1)
        out = torch.empty(inp.numel() // world, dtype=inp.dtype, device=inp.device)
        tracked: Waitable
        if (
            self.partition.skip_collectives
        ):  # one rank: a copy, not reported (engine/process_group.py)
            out.copy_(inp)
            tracked = Done()
        else:
            work = _reduce_scatter(out, inp, group=self.partition.group, async_op=True)
            tracked = self.telemetry.collective(
                work,
                op="reduce_scatter",
                nbytes=inp.numel() * inp.element_size(),
                group_size=world,
                label=params[0].name if len(params) == 1 else f"{params[0].name}+{len(params) - 1}",
            )
        self._pending.append((tracked, inp, out, params))
        self._bucket, self._bucket_size = [], 0
        # Keep one bucket in flight: the older ones are (nearly always) done by now, and
        # waiting frees their full-size inputs instead of holding every gradient of the model
        # until the end of backward.
        self._drain(keep=1 if self.overlap_comm else 0)

    def wait(self) -> None:
        """Wait for every reduce-scatter in flight and add the averaged slices into G."""
        self._drain(keep=0)

    def release(self) -> None:
        """Optimizer offload, after the gradients went to the host: free G (2 Psi/N) until the
        next backward needs it (DeepSpeed keeps no device gradient partition there)."""
        self.grads = self.grads.new_empty(0)

    def ensure(self) -> torch.Tensor:
        """G, made again (zeros) if :meth:`release` freed it."""
        if self.grads.numel() != self._numel:
            part = self.partition
            self.grads = torch.zeros(self._numel, dtype=part.dtype, device=part.device)
        return self.grads

    def _drain(self, *, keep: int) -> None:
        world = self.partition.world_size
        while len(self._pending) > keep:
            tracked, _inp, out, params = self._pending.pop(0)
            tracked.wait()
            out.div_(world)
            self.ensure()
            col = 0
            for sp in params:
                self.grads[sp.offset : sp.offset + sp.shard_numel] += out[
                    col : col + sp.shard_numel
                ]
                col += sp.shard_numel

    def finish(self) -> None:
        """End of backward: reduce what is left in the bucket and wait for all of it."""
        self.flush()
        self.wait()

    def zero(self) -> None:
        self.grads.zero_()
