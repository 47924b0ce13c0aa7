"""DistributedDataParallel: a full replica per rank, gradients all-reduced in buckets.

Found when a ``DistributedDataParallel`` is built (its ``__init__`` is wrapped at class level).
Steps end at the loop's ``optimizer.step()`` (:mod:`.torch_loop`).

DDP's gradient all-reduces run inside its C++ reducer, below every Python method the attach
wraps. The attach leaves the reducer alone (no comm hook: the job runs exactly what it would
without zeroscope) and reads those all-reduces from torch's Flight Recorder instead
(:mod:`.flight_recorder`): exact bytes and counts, labelled ``DDP``; on gloo no clock saw them
end, so their duration, busbw and exposed time are NA. Memory: P the full replica, G the
gradients plus the reducer's bucket buffers (their sizes from DDP's own logging data, once it
rebuilt its buckets; with ``gradient_as_bucket_view`` the gradients are views into them), O the
optimizer state.

Under ``torch.compile`` the forward wrapper runs nothing inside the traced region; the compiled
model's ``OptimizedModule.__call__`` times the phases instead (:mod:`.compiled`).

Not seen: the C++ broadcasts and shape checks DDP runs in ``__init__`` (before the group is
watched).
"""

from __future__ import annotations

import weakref
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from zeroscope.agent.schema import ConfigSummary, ParamCounts

from . import compiled, patches
from .census import Census
from .flight_recorder import READER as RECORDER
from .optimizer_slots import optimizer_config, sharded_by
from .session import SESSION, EngineReader, precision_of
from .torch_loop import optimizer_state, state_size, timed_forward


class DDPReader(EngineReader):
    kind = "ddp"
    priority = 10

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self._ddp = weakref.ref(ddp)
        self._buckets: int | None = None
        """The reducer's bucket bytes once it rebuilt its buckets (0: views of the grads)."""

    def alive(self) -> bool:
        return self._ddp() is not None

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        ddp = self._ddp()
        assert ddp is not None
        params = list(ddp.module.parameters())
        opt = SESSION.cycle.primary()
        # torch's ZeRO-1 (ZeroRedundancyOptimizer) beside DDP: O sharded over its group, the
        # gradients still all-reduced whole by DDP's reducer, the updated shards broadcast.
        zero = sharded_by(opt) > 1
        config = ConfigSummary(
            stage=1 if zero else 0,
            precision=precision_of(params[0].dtype) if params else "fp32",
            dp_world_size=ddp.process_group.size(),
            reduce_bucket_size=int(ddp.bucket_bytes_cap),
            grad_buckets_separate=not ddp.gradient_as_bucket_view,
            grads_all_reduced=zero,
            **optimizer_config(SESSION.cycle.optimizers()),
        )
        counts = ParamCounts(
            total=sum(p.numel() for p in params),
            trainable=sum(p.numel() for p in params if p.requires_grad),
            largest_layer=max(
                (sum(p.numel() for p in m.parameters(recurse=False)) for m in ddp.module.modules()),
                default=0,
            ),
        )
        return config, counts, str(params[0].device) if params else "cpu"

    def layout(self) -> Any:
        return state_size(SESSION.cycle.optimizers())

    def count_grads(self, census: Census) -> None:
        ddp = self._ddp()
        if ddp is None:
            return
        census.add("grads", (p.grad for p in ddp.module.parameters()))
        buckets = self._bucket_bytes(ddp)
        if buckets:
            census.add_bytes("grads", buckets)

    def _bucket_bytes(self, ddp: DistributedDataParallel) -> int | None:
        """The reducer's bucket buffers [bytes], from DDP's own logging data, read once its
        buckets were rebuilt (after the first backward); 0 with ``gradient_as_bucket_view``
        (the gradients, counted already, are the buckets); None until known."""
        if self._buckets is not None:
            return self._buckets
        if ddp.gradient_as_bucket_view:
            self._buckets = 0
            return 0
        try:
            data = ddp._get_ddp_logging_data()
            if not data.get("has_rebuilt_buckets"):
                sizes = str(data.get("bucket_sizes", ""))
                return sum(int(x) for x in sizes.split(",") if x.strip()) or None
            sizes = str(data.get("rebuilt_bucket_sizes", ""))
            self._buckets = sum(int(x) for x in sizes.split(",") if x.strip())
        except Exception as exc:
            self._buckets = 0
            SESSION.lost("DDP's bucket buffers in G", f"its logging data is unreadable ({exc!r})")
        return self._buckets

    def count_state(self, census: Census) -> None:
        ddp = self._ddp()
        if ddp is None:
            return
        params = list(ddp.module.parameters())
        # Frozen parameters (no gradient, no optimizer state) are replicated like the others.
        census.add("params", (p for p in params if not p.requires_grad), frozen=True)
        census.add("params", params)
        optimizer_state(census, SESSION.cycle.optimizers())


def install() -> None:
    """Wrap ``DistributedDataParallel.__init__`` (to find the model and watch its group in the
    Flight Recorder) and ``forward`` (the forward and backward phases); nothing else of DDP."""
    init = DistributedDataParallel.__init__
    forward = DistributedDataParallel.forward

    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        s = SESSION
        if not s.passive:
            try:
                RECORDER.watch(self.process_group, "DDP")
                s.found(DDPReader(self))
            except Exception:
                s.errors += 1

    def forward_(self: DistributedDataParallel, *inputs: Any, **kwargs: Any) -> Any:
        # Traced by Dynamo under torch.compile: the check folds to a constant and the agent
        # runs nothing here; the compiled model's own wrapper times it (:mod:`.compiled`).
        if compiled.tracing() or compiled.OUTER[0]:
            return forward(self, *inputs, **kwargs)
        s = SESSION
        if s.passive or s.tel is None:
            return forward(self, *inputs, **kwargs)
        return timed_forward(forward, self, self.module, inputs, kwargs)

    compiled.register(compiled.OWNERS, lambda module: isinstance(module, DistributedDataParallel))
    compiled.register(compiled.INPUTS, lambda module: isinstance(module, DistributedDataParallel))
    compiled.register(
        compiled.ORIGINAL_FORWARD,
        lambda module: forward if isinstance(module, DistributedDataParallel) else None,
    )
    __init__.__doc__ = init.__doc__
    forward_.__doc__ = forward.__doc__
    patches.replace(DistributedDataParallel, "__init__", __init__)
    patches.replace(DistributedDataParallel, "forward", forward_)
