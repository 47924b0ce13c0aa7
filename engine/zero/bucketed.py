"""Stages 0, 1 and 2: the model's parameters live in flat, bucketed buffers; gradients are
averaged bucket by bucket; each rank steps the part of the optimizer state it owns.

Layout. Trainable parameters of each optimizer param group are cut into buckets of at most
``reduce_bucket_size`` elements, in *reverse* registration order (the order backward produces
gradients). Each bucket is one flat 16-bit buffer that the parameters are views into, padded to
a multiple of the shard count and cut into equal shards (zero/partition.py). With one shard per
rank (stages 1, 2) a bucket's reduce-scatter hands each rank exactly the gradients of the
master shard it owns, and the post-step all-gather writes every rank's updated shard straight
back into the parameters — no copies, the same 2 Psi traffic as DDP's all-reduce (ZeRO paper §7).

The stages differ only in policy (zero/stages.py):

- stage 0: one shard (everyone steps everything); gradients all-reduced at the boundary.
- stage 1: O sharded; full gradients accumulate locally, one reduce-scatter per bucket at
  the boundary (in place: the rank's chunk of the buffer receives the sum).
- stage 2: O and G sharded; every micro-step reduce-scatters each bucket as soon as its
  gradients are complete and adds the rank's chunk into a persistent 1/N gradient shard; the
  full-size bucket buffer is freed right after.

``overlap_comm`` launches a bucket's collective from the parameters' post-accumulate-grad
hooks during backward (in bucket order on every rank, as collectives must match). At stage 2 at
most one reduction stays in flight: launching a bucket waits for the one before it and frees
that one's full-size buffer (DeepSpeed double-buffers its ``ipg`` buckets the same way), so the
gradient peak during backward is ``Psi/N`` plus about two buckets, not ``Psi``; the rest is
waited for at the boundary. ``contiguous_gradients`` makes ``param.grad`` views into one
persistent flat buffer (stages 0-1); without it gradients are packed into a transient buffer at
reduction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from zeroscope.agent.api import Waitable
from zeroscope.agent.schema import MemoryBytes
from zeroscope.engine.optim import AdamState
from zeroscope.engine.precision import copy_master_to_params, master_copy
from zeroscope.engine.process_group import Comm

from .partition import FlatLayout, make_layout, split_buckets, views_of
from .strategy import Shard


@dataclass(kw_only=True, slots=True)
class Policy:
    """What distinguishes stages 0, 1 and 2."""

    stage: int
    shards: int
    """Shard count: 1 at stage 0, the data-parallel size at stages 1-2."""
    reduce_every_micro_step: bool
    """Stage 2: reduce each backward (only 1/N of the gradients may persist)."""
    reduce_scatter: bool = True
    overlap: bool = False
    contiguous: bool = True
    offload_optimizer: bool = False
    """O lives in an offload store (engine/offload.py), which builds it on the host: no fp32
    master or Adam moments are made on the device."""


@dataclass(kw_only=True, slots=True)
class _Bucket:
    params: list[torch.nn.Parameter]
    layout: FlatLayout
    group: int
    flat: torch.Tensor
    """The parameters, flat, in the compute dtype (P)."""
    start: int
    end: int
    grad: torch.Tensor | None = None
    """Full flat gradient buffer (persistent when contiguous at stages 0-1, else transient)."""
    grad_shard: torch.Tensor | None = None
    """Stage 2: this rank's persistent averaged gradient chunk."""
    ready: int = 0
    launched: bool = False
    accumulated: bool = False
    pending: tuple[Waitable, torch.Tensor] | None = None
    slots: dict[int, int] = field(default_factory=dict)
    """id(param) -> index in ``params``."""

    def grad_views(self) -> list[torch.Tensor]:
        assert self.grad is not None
        return views_of(self.grad, self.layout, [p.shape for p in self.params])


class BucketedStrategy:
    """Stages 0-2 (see the module docstring); implements zero/strategy.py's protocol."""

    def __init__(
        self,
        *,
        groups: list[list[torch.nn.Parameter]],
        comm: Comm,
        policy: Policy,
        bucket_size: int,
    ) -> None:
        self.comm, self.policy = comm, policy
        self.stage = policy.stage
        # At world 1 with forced collectives (engine/process_group.py) stages 1-2 reduce-scatter, gather
        # and all-reduce the norm as they do on N ranks.
        self.sharded = policy.shards > 1 or (policy.stage > 0 and not comm.skip)
        self._rank = comm.rank if self.sharded else 0
        self._buckets: list[_Bucket] = []
        self._shards: list[Shard] = []
        self._where: dict[int, _Bucket] = {}
        self._reducing = False
        self._held = False
        self._next_launch = 0
        self._in_flight: list[_Bucket] = []
        """Stage 2 with overlap: buckets whose reduction runs now (at most one is kept)."""
        for g, params in enumerate(groups):
            ordered = list(reversed(params))
            for idx in split_buckets([p.numel() for p in ordered], bucket_size):
                self._add_bucket([ordered[i] for i in idx], g)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad_ready)
            for b in self._buckets
            for p in b.params
        ]

    def _add_bucket(self, params: list[torch.nn.Parameter], group: int) -> None:
        layout = make_layout([p.numel() for p in params], self.policy.shards)
        device, dtype = params[0].device, params[0].dtype
        flat = torch.zeros(layout.padded_numel, dtype=dtype, device=device)
        for p, view in zip(params, views_of(flat, layout, [p.shape for p in params])):
            view.copy_(p.detach())
            p.data = view  # the parameter now lives in the flat buffer
        # Every rank starts from rank 0's weights, as DeepSpeed's _broadcast_model does.
        self.comm.broadcast(flat, src=0, label="init").wait()
        start, end = layout.shard_range(self._rank)
        b = _Bucket(params=params, layout=layout, group=group, flat=flat, start=start, end=end)
        b.slots = {id(p): i for i, p in enumerate(params)}
        if self.policy.reduce_every_micro_step:
            if not self.policy.offload_optimizer:  # else made at the first reduction
                b.grad_shard = torch.zeros(end - start, dtype=dtype, device=device)
        elif self.policy.contiguous:
            b.grad = torch.zeros_like(flat)
            for p, view in zip(params, b.grad_views()):
                p.grad = view
        if self.policy.offload_optimizer:
            master, state = flat[start:end], AdamState.elsewhere(device)
        else:
            master = master_copy(flat[start:end])
            state = AdamState.zeros_like(master)
        self._shards.append(Shard(master=master, state=state, group=group))
        self._buckets.append(b)
        for p in params:
            self._where[id(p)] = b

    # -- the protocol --------------------------------------------------------------------------

    @property
    def shards(self) -> list[Shard]:
        return self._shards

    def begin_micro_step(self, *, boundary: bool) -> None:
        self._reducing = boundary or self.policy.reduce_every_micro_step
        self._next_launch = 0
        self._in_flight = []
        for b in self._buckets:
            if b.pending is not None:  # stage 2: the previous micro-step's reductions
                self._finish(b)
            b.ready, b.launched = 0, False

    def end_micro_step(self) -> None:
        if not self._reducing:
            return
        for b in self._buckets[self._next_launch :]:
            self._collect(b, b.params)
        self._launch_ready(all_ready=True)

    def hold_reductions(self, hold: bool) -> None:
        """Pipeline parallel (engine/parallel): while held, backward only accumulates into
        ``param.grad``; the next reducing ``end_micro_step`` reduces all of it at once."""
        self._held = hold

    def reduced_grads(self) -> list[torch.Tensor]:
        grads = []
        for b in self._buckets:
            if b.pending is not None:
                self._finish(b)
            if self.policy.reduce_every_micro_step:
                assert b.grad_shard is not None, "step() without a reducing backward"
                grads.append(b.grad_shard)
            else:
                assert b.grad is not None, "step() without a reducing backward"
                grads.append(b.grad[b.start : b.end])
        return grads

    def publish_params(self) -> None:
        handles = []
        for b, shard in zip(self._buckets, self._shards):
            copy_master_to_params(shard.master, b.flat[b.start : b.end])
            if self.sharded:
                handles.append(
                    self.comm.all_gather(b.flat, b.flat[b.start : b.end], label="params")
                )
        for h in handles:
            h.wait()

    def zero_grads(self) -> None:
        for b in self._buckets:
            b.accumulated = False
            if b.grad is not None and self._contiguous_full_grads:
                b.grad.zero_()
                for p, view in zip(b.params, b.grad_views()):
                    p.grad = view
            else:
                b.grad = None
                for p in b.params:
                    p.grad = None

    def release_grads(self) -> None:
        """Optimizer offload, after the gradients went to the host: free the stage-2 gradient
        shards (2 Psi/N) until the next backward makes them again; DeepSpeed keeps no device
        gradient partition between steps either."""
        if self.policy.reduce_every_micro_step:
            for b in self._buckets:
                b.grad_shard = None

    @property
    def _contiguous_full_grads(self) -> bool:
        """Stages 0-1 with contiguous_gradients: ``param.grad`` are views of ``b.grad``."""
        return self.policy.contiguous and not self.policy.reduce_every_micro_step

    def memory(self) -> MemoryBytes:
        params = grads = optim = 0
        for b, shard in zip(self._buckets, self._shards):
            params += b.flat.numel() * b.flat.element_size()
            if b.grad is not None:
                grads += b.grad.numel() * b.grad.element_size()
            if b.grad_shard is not None:
                grads += b.grad_shard.numel() * b.grad_shard.element_size()
            if not self.policy.contiguous and b.grad is None:
                grads += sum(
                    p.grad.numel() * p.grad.element_size() for p in b.params if p.grad is not None
                )
            if shard.master.data_ptr() != b.flat.data_ptr() + b.start * b.flat.element_size():
                optim += shard.master.numel() * 4
            optim += shard.state.nbytes
        return MemoryBytes(params=params, grads=grads, optim=optim)

    def param_counts(self) -> tuple[int, int]:
        total = sum(b.layout.numel for b in self._buckets)
        return total, sum(b.layout.padded_numel for b in self._buckets)

    def state_dict(self) -> dict[str, Any]:
        return {
            "shards": [
                {
                    "master": s.master.detach().clone(),
                    "exp_avg": s.state.exp_avg,
                    "exp_avg_sq": s.state.exp_avg_sq,
                    "step": s.state.step,
                }
                for s in self._shards
            ]
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for s, saved in zip(self._shards, state["shards"], strict=True):
            s.master.copy_(saved["master"])
            s.state.exp_avg.copy_(saved["exp_avg"])
            s.state.exp_avg_sq.copy_(saved["exp_avg_sq"])
            s.state.step = int(saved["step"])
        self.publish_params()

    # -- gradients into buckets, buckets into collectives -------------------------------------

    def _on_grad_ready(self, param: torch.Tensor) -> None:
        """Post-accumulate-grad hook: this backward finished ``param``'s gradient."""
        if not self._reducing or self._held:
            return
        b = self._where[id(param)]
        if not (self.policy.overlap or self.policy.reduce_every_micro_step):
            return  # collected after backward
        self._collect(b, [param])  # type: ignore[list-item]
        b.ready += 1
        self._launch_ready(all_ready=False)

    def _collect(self, b: _Bucket, params: list[torch.nn.Parameter]) -> None:
        """Make sure the gradients of ``params`` sit in the bucket's flat buffer."""
        if b.grad is None:
            b.grad = torch.zeros_like(b.flat)
        for p in params:
            if p.grad is None:
                continue  # unused in this backward: counts as zero (ignore_unused_parameters)
            i = b.slots[id(p)]
            off = b.layout.offsets[i]
            view = b.grad[off : off + b.layout.numels[i]].view(p.shape)
            if p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
                p.grad = view if self._contiguous_full_grads else None

    def _launch_ready(self, *, all_ready: bool) -> None:
        """Launch complete buckets strictly in bucket order (every rank issues the same
        collectives in the same order)."""
        while self._next_launch < len(self._buckets):
            b = self._buckets[self._next_launch]
            if not all_ready and b.ready < len(b.params):
                return
            self._launch(b)
            self._next_launch += 1

    def _launch(self, b: _Bucket) -> None:
        assert b.grad is not None
        b.launched = True
        full = b.grad
        if not self.sharded:
            b.pending = (self.comm.all_reduce(full, label="grads"), full)
        elif self.policy.reduce_scatter:
            out = full[b.start : b.end]
            if self.policy.reduce_every_micro_step:  # its own buffer: ``full`` is freed after
                out = torch.empty(b.end - b.start, dtype=full.dtype, device=full.device)
            b.pending = (self.comm.reduce_scatter(out, full, label="grads"), out)
        else:
            b.pending = (self.comm.all_reduce(full, label="grads"), full[b.start : b.end])
        if not self.policy.overlap:
            self._finish(b)
        elif self.policy.reduce_every_micro_step:
            # Free the previous bucket's full-size buffer once its reduction is done (the
            # module docstring): one reduction in flight while backward goes on.
            self._in_flight.append(b)
            while len(self._in_flight) > 1:
                older = self._in_flight.pop(0)
                if older.pending is not None:
                    self._finish(older)

    def _finish(self, b: _Bucket) -> None:
        """Wait for the bucket's reduction and turn the sum into the average."""
        assert b.pending is not None
        handle, out = b.pending
        b.pending = None
        handle.wait()
        out.div_(self.comm.world_size)
        if self.policy.reduce_every_micro_step:
            if b.grad_shard is None:  # first reduction since release_grads (offload)
                # (a view into the full bucket, from the all-reduce fallback, must not keep it)
                b.grad_shard = out if out._base is None else out.clone()
            elif b.accumulated:
                b.grad_shard.add_(out)
            else:
                b.grad_shard.copy_(out)
            b.accumulated = True
            b.grad = None  # stage 2 keeps only its 1/N
