"""DistributedDataParallel: a full replica per rank, gradients all-reduced in buckets.

Found when a ``DistributedDataParallel`` is built (its ``__init__`` is wrapped at class level).
Steps end at the loop's ``optimizer.step()`` (:mod:`.torch_loop`).

DDP's default gradient all-reduce runs inside its C++ reducer, below Python, where no
ProcessGroup wrapper can see it. So on the first forward, unless the script registered a comm
hook of its own, the attach registers a Python hook doing exactly what the built-in one does
(reducer.cpp: scale by ``1/world`` — a multiply while copying, or a divide when gradients
already are bucket views — then all-reduce SUM), through ``dist.all_reduce``, so the class-level
wrappers time each bucket and name it (``bucket 3``). A hook the script registers later is
chained through it (DDP accepts one hook per model). Memory: P the full replica, G the
gradients plus the reducer's bucket buffers (one storage each; with ``gradient_as_bucket_view``
the gradients are views into them), O the optimizer state.

Not seen: the C++ broadcasts and shape checks DDP runs in ``__init__``; built-in C++ hooks
(``_register_builtin_comm_hook``) and the compiled (python-reducer) path.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from zeroscope.agent.schema import ConfigSummary, ParamCounts

from . import collectives, patches
from .census import Census
from .session import SESSION, EngineReader, precision_of
from .torch_loop import optimizer_state, state_size, time_backward


class _Hook:
    """State of the attach's comm hook on one DDP model."""

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self.group = ddp.process_group
        self.as_view = bool(ddp.gradient_as_bucket_view)
        self.params = [p for p in ddp.parameters() if p.requires_grad]
        self.buffers: dict[int, Any] = {}  # bucket index -> weakref to its buffer
        self.chained: tuple[Any, Any] | None = None  # (state, hook) registered later
        self.aliased = False

    def __call__(self, _: Any, bucket: Any) -> Any:
        if self.chained is not None:
            state, hook = self.chained
            return hook(state, bucket)
        buffer = bucket.buffer()
        index = bucket.index()
        self.buffers[index] = weakref.ref(buffer)
        n = self.group.size()
        # reducer.cpp, mark_variable_ready_dense: without a hook DDP multiplies by 1/world while
        # copying a gradient into its bucket, or divides in place when it already is a view.
        if self.aliased:
            buffer.div_(n)
        else:
            buffer.mul_(1.0 / n)
        log = collectives.LOG
        label, log.label = log.label, f"bucket {index}"
        try:
            work = dist.all_reduce(buffer, group=self.group, async_op=True)
        finally:
            log.label = label
        # DDP waits on the future in C++ and never calls wait(): its completion is the bucket's
        # end, stamped in the one callback DDP needs anyway (the value it expects is a tensor).
        rec = log.waiting.pop(id(work), None)

        def done(fut: Any) -> Any:
            collectives.stamp_end(rec)
            return fut.value()[0]

        return collectives.future_of(work).then(done)


_hooks: weakref.WeakKeyDictionary[Any, _Hook] = weakref.WeakKeyDictionary()
_own_hooks: weakref.WeakSet[Any] = weakref.WeakSet()  # models whose script registered a hook


class DDPReader(EngineReader):
    kind = "ddp"
    priority = 10

    def __init__(self, ddp: DistributedDataParallel) -> None:
        self._ddp = weakref.ref(ddp)

    def alive(self) -> bool:
        return self._ddp() is not None

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        ddp = self._ddp()
        assert ddp is not None
        params = list(ddp.module.parameters())
        opt = SESSION.primary_optimizer()
        config = ConfigSummary(
            stage=0,
            precision=precision_of(params[0].dtype) if params else "fp32",
            dp_world_size=ddp.process_group.size(),
            reduce_bucket_size=int(ddp.bucket_bytes_cap),
            optimizer=type(opt).__name__ if opt is not None else "",
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
        return state_size(SESSION.primary_optimizer())

    def count_grads(self, census: Census) -> None:
        ddp = self._ddp()
        if ddp is None:
            return
        census.add("grads", (p.grad for p in ddp.module.parameters()))
        hook = _hooks.get(ddp)
        if hook is not None:
            census.add("grads", (ref() for ref in hook.buffers.values()))

    def count_state(self, census: Census) -> None:
        ddp = self._ddp()
        if ddp is None:
            return
        params = list(ddp.module.parameters())
        # Frozen parameters (no gradient, no optimizer state) are replicated like the others.
        census.add("params", (p for p in params if not p.requires_grad), frozen=True)
        census.add("params", params)
        optimizer_state(census, SESSION.primary_optimizer())


HOOK_ENV = "ZEROSCOPE_DDP_HOOK"
"""``0``: leave DDP's built-in C++ all-reduce alone (its collectives are then not seen)."""


def _install_hook(ddp: DistributedDataParallel) -> None:
    if ddp in _hooks or ddp in _own_hooks or getattr(ddp, "_comm_hooks", None):
        return
    if os.environ.get(HOOK_ENV, "1") == "0":
        _own_hooks.add(ddp)
        return
    hook = _Hook(ddp)
    dist._register_comm_hook(ddp.reducer, None, hook)
    _hooks[ddp] = hook


def install() -> None:
    init = DistributedDataParallel.__init__
    forward = DistributedDataParallel.forward
    register = DistributedDataParallel.register_comm_hook
    builtin = DistributedDataParallel._register_builtin_comm_hook

    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        s = SESSION
        if not s.passive:
            try:
                s.found(DDPReader(self))
            except Exception:
                s.errors += 1

    def forward_(self: DistributedDataParallel, *inputs: Any, **kwargs: Any) -> Any:
        s = SESSION
        if s.passive or s.tel is None:
            return forward(self, *inputs, **kwargs)
        try:
            hook = _hooks.get(self)
            if hook is None:
                _install_hook(self)
            elif hook.as_view and (hook.group.size() & (hook.group.size() - 1)):
                # Only where 1/n is inexact (n not a power of two) does mul vs div matter.
                hook.aliased = all(p.grad is not None for p in hook.params)
        except Exception:
            s.errors += 1
        s.enter("forward")
        try:
            out = forward(self, *inputs, **kwargs)
        finally:
            s.exit("forward")
        time_backward(out)
        return out

    def register_comm_hook(self: DistributedDataParallel, state: object, hook: Any) -> None:
        ours = _hooks.get(self)
        if ours is None:
            _own_hooks.add(self)
            return register(self, state, hook)
        ours.chained = (state, hook)  # DDP takes one hook: the script's runs inside ours
        return None

    def _register_builtin_comm_hook(self: DistributedDataParallel, comm_hook_type: Any) -> None:
        _own_hooks.add(self)
        return builtin(self, comm_hook_type)

    __init__.__doc__ = init.__doc__
    forward_.__doc__ = forward.__doc__
    register_comm_hook.__doc__ = register.__doc__
    patches.replace(DistributedDataParallel, "__init__", __init__)
    patches.replace(DistributedDataParallel, "forward", forward_)
    patches.replace(DistributedDataParallel, "register_comm_hook", register_comm_hook)
    patches.replace(
        DistributedDataParallel, "_register_builtin_comm_hook", _register_builtin_comm_hook
    )
