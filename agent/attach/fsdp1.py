"""FSDP1 (``torch.distributed.fsdp.FullyShardedDataParallel``): the classic wrapper, flat
parameters sharded per rank. What the HF Trainer's ``fsdp="full_shard"`` and accelerate's FSDP
plugin (``fsdp_version: 1``, its default) build on GPUs.

Read through FSDP1's public API only: ``FullyShardedDataParallel.__init__`` and ``forward`` are
wrapped at class level (as DDP's), ``sharding_strategy``, ``process_group``, ``mixed_precision``,
``cpu_offload``, ``compute_device`` and ``FullyShardedDataParallel.fsdp_modules`` say the
layout. The root is the outermost instance: the one built last outside another's
``__init__`` (an ``auto_wrap_policy`` builds the inner ones inside the root's; a script that
wraps blocks by hand builds them first). Its forward is the step's forward (the inner ones run
inside it and are passed through); FSDP1's all-gathers and reduce-scatters are
``all_gather_into_tensor`` / ``reduce_scatter_tensor`` calls the class-level ProcessGroup
wrappers see, labelled ``FSDP``.

The ZeRO stage is the sharding strategy's: ``FULL_SHARD`` (and ``HYBRID_SHARD`` within its
shard group) is ZeRO-3, ``SHARD_GRAD_OP`` ZeRO-2 (parameters sharded again after backward, so
sharded at the step), ``NO_SHARD`` ZeRO-0. Psi is counted from the modules' own parameters as
each instance is built, before FSDP1 flattens them (a flat parameter holds only this rank's
padded shard). Memory, each storage once, at the step: P = the root's parameters (the flat
parameters' local shards, or with ``use_orig_params=True`` the original parameters, views into
them), G = their gradients, O = the optimizer's state; with ``CPUOffload(offload_params=True)``
all three are on the host. Frozen parameters and the unsharded buffers held between forward
and backward are not told apart (``frozen_params``, ``gathered_params`` not reported).
"""

from __future__ import annotations

import weakref
from typing import Any

from zeroscope.agent.schema import ConfigSummary, ParamCounts

from . import compiled, patches
from .census import Census
from .optimizer_slots import optimizer_config
from .session import SESSION, EngineReader, precision_of
from .torch_loop import optimizer_state, state_size, timed_forward

STAGES = {
    "FULL_SHARD": 3,
    "HYBRID_SHARD": 3,
    "SHARD_GRAD_OP": 2,
    "_HYBRID_SHARD_ZERO2": 2,
    "NO_SHARD": 0,
}
"""ZeRO stage of each ``ShardingStrategy`` (by name)."""

_COUNTS: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()
"""Per FSDP1 instance: (parameters, trainable parameters) it flattened, counted as it was
built."""

_building = [0]
"""FSDP1 ``__init__`` calls under way: an instance built inside another's is not a root."""


def _own_params(fsdp: Any, module: Any) -> tuple[int, int]:
    """Elements of ``module``'s parameters no inner FSDP1 instance has flattened already
    (those are the inner instance's, counted when it was built by hand): the inner instances
    are found with FSDP1's public ``fsdp_modules``."""
    inner = {id(p) for m in fsdp.fsdp_modules(module) for p in m.parameters()}
    total = trainable = 0
    for p in module.parameters():
        if id(p) in inner:
            continue
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable


class FSDP1Reader(EngineReader):
    kind = "fsdp"
    priority = 20

    def __init__(self, root: Any) -> None:
        self._root = weakref.ref(root)

    def alive(self) -> bool:
        return self._root() is not None

    def _offloaded(self, root: Any) -> bool:
        return bool(getattr(root.cpu_offload, "offload_params", False))

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        root = self._root()
        assert root is not None
        strategy = getattr(root.sharding_strategy, "name", str(root.sharding_strategy))
        stage = STAGES.get(strategy, 3)
        params = list(root.parameters())
        held = params[0].dtype if params else None
        mp = root.mixed_precision
        dtype = getattr(mp, "param_dtype", None) or held
        offload = "cpu" if self._offloaded(root) else "none"
        config = ConfigSummary(
            stage=stage,
            precision=precision_of(dtype) if dtype is not None else "fp32",
            dp_world_size=int(root.process_group.size()),
            offload_optimizer=offload,
            offload_param=offload,
            **optimizer_config(SESSION.cycle.optimizers()),
            held_precision=precision_of(held) if held is not None else None,
            params_sharded_at_step=stage == 2,
        )
        counted = [_COUNTS.get(m, (0, 0)) for m in type(root).fsdp_modules(root)]
        counts = ParamCounts(total=sum(t for t, _ in counted), trainable=sum(t for _, t in counted))
        return config, counts, str(root.compute_device)

    def layout(self) -> Any:
        return state_size(SESSION.cycle.optimizers())

    def count_grads(self, census: Census) -> None:
        root = self._root()
        if root is not None:
            census.add("grads", (p.grad for p in root.parameters()), host=self._offloaded(root))

    def count_state(self, census: Census) -> None:
        root = self._root()
        if root is None:
            return
        host = self._offloaded(root)
        census.add("params", root.parameters(), host=host)
        optimizer_state(census, SESSION.cycle.optimizers(), host=host)


def install() -> None:
    """Wrap ``FullyShardedDataParallel.__init__`` (Psi, the root) and ``forward`` (the forward
    and backward phases, the model's inputs) once FSDP1's module is imported."""
    from . import postimport
    from .install import guarded

    def ready(module: Any) -> None:
        guarded("FSDP", lambda: install_class(module.FullyShardedDataParallel))

    postimport.when_imported("torch.distributed.fsdp.fully_sharded_data_parallel", ready)


def install_class(fsdp: Any) -> None:
    init, forward = fsdp.__init__, fsdp.forward

    def __init__(self: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        s = SESSION
        nested = _building[0] > 0  # its parameters are counted in the outer instance's
        try:
            counts = (0, 0) if nested else _own_params(fsdp, module)
        except Exception:
            counts = (0, 0)
        _building[0] += 1
        try:
            init(self, module, *args, **kwargs)
        finally:
            _building[0] -= 1
        if s.passive:
            return
        try:
            _COUNTS[self] = counts
            if not nested:  # an inner instance of an auto_wrap_policy is not a root
                s.found(FSDP1Reader(self))
        except Exception:
            s.errors += 1

    def forward_(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        # Traced by Dynamo under torch.compile: the check folds to a constant (see :mod:`.compiled`).
        if compiled.tracing() or compiled.OUTER[0]:
            return forward(self, *inputs, **kwargs)
        s = SESSION
        if s.passive or s.tel is None or s.phase_depth("forward"):  # an inner instance
            return forward(self, *inputs, **kwargs)
        return timed_forward(forward, self, self.module, inputs, kwargs, label="FSDP")

    # A compiled root (``torch.compile(FSDP(model))``) is timed by the compiled model's wrapper
    # and compiled from FSDP1's own forward, as DDP's (:mod:`.compiled`).
    compiled.register(compiled.OWNERS, lambda module: isinstance(module, fsdp))
    compiled.register(compiled.INPUTS, lambda module: isinstance(module, fsdp))
    compiled.register(
        compiled.ORIGINAL_FORWARD, lambda module: forward if isinstance(module, fsdp) else None
    )
    __init__.__doc__ = init.__doc__
    forward_.__doc__ = forward.__doc__
    patches.replace(fsdp, "__init__", __init__)
    patches.replace(fsdp, "forward", forward_)
