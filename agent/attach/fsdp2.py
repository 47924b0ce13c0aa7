"""FSDP2 (``torch.distributed.fsdp.fully_shard``): sharded DTensor parameters per rank.

``FSDPState._pre_forward`` / ``_post_forward`` are wrapped at class level as soon as FSDP2's
state module is imported, before any ``fully_shard`` call binds them as forward hooks; the
root state (the first to run forward, FSDP2's own rule) is the engine found, and times the
forward phase. Steps end at the loop's ``optimizer.step()``; FSDP2's all-gathers and
reduce-scatters are ``all_gather_single`` / ``reduce_scatter_single`` calls the class-level
ProcessGroup wrappers see, named by the issuing module (``FSDP layers.0``).

Memory, from FSDP2's own state (each storage once): P = each FSDPParam's padded local shard
(``_sharded_param_data``), frozen ones (``requires_grad=False``) included and also reported
apart as ``frozen_params``; G = the sharded gradients' local tensors (views into the
reduce-scatter output); O = the optimizer state (DTensor local shards); ``gathered_params`` =
unsharded parameters held at the moment of the count (``reshard_after_forward=False`` keeps
them between forward and backward). Under ``torch.compile`` the forward hooks run nothing
inside the traced region: a root compiled whole is timed and found by the compiled model's
wrapper (:mod:`.compiled`); blocks compiled one by one need nothing of it. With ``CPUOffloadPolicy`` parameters, gradients and
optimizer state live on the host: they are counted in ``host_*``.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts

from . import collectives, compiled, patches
from .census import Census, local_tensor
from .optimizer_slots import optimizer_config
from .private_api import missing
from .session import SESSION, EngineReader, precision_of
from .torch_loop import optimizer_state, state_size, time_backward


def _fsdp_params(root: Any) -> list[Any]:
    states = getattr(root._state_ctx, "all_states", None) or [root]
    return [
        fp for state in states for group in state._fsdp_param_groups for fp in group.fsdp_params
    ]


class FSDP2Reader(EngineReader):
    kind = "fsdp2"
    priority = 20

    def __init__(self, root_state: Any) -> None:
        self._root = weakref.ref(root_state)

    def alive(self) -> bool:
        return self._root() is not None

    def _params(self) -> list[Any]:
        root = self._root()
        return _fsdp_params(root) if root is not None else []

    def _offloaded(self, params: list[Any]) -> bool:
        return any(fp.offload_to_cpu for fp in params)

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        root = self._root()
        assert root is not None
        params = self._params()
        first = params[0] if params else None
        groups = [g for s in root._state_ctx.all_states for g in s._fsdp_param_groups]
        # The root never reshards after forward; the others say whether this is ZeRO-3-like
        # (reshard_after_forward=True) or ZeRO-2-like.
        inner = [g for g in groups if g not in root._fsdp_param_groups] or groups
        reshard = any(g.post_forward_mesh_info is not None for g in inner)
        mp = first.mp_policy if first is not None else None
        dtype = getattr(mp, "param_dtype", None) or (first.orig_dtype if first else None)
        world = first.mesh_info.shard_mesh_size if first is not None else 1
        offload = "cpu" if self._offloaded(params) else "none"
        config = ConfigSummary(
            stage=3 if reshard else 2,
            precision=precision_of(dtype) if dtype is not None else "fp32",
            dp_world_size=int(world),
            offload_optimizer=offload,
            offload_param=offload,
            **optimizer_config(SESSION.cycle.optimizers()),
            held_precision=precision_of(first.orig_dtype) if first is not None else None,
            params_sharded_at_step=not reshard,
        )
        total = sum(fp._orig_size.numel() for fp in params)
        trainable = sum(fp._orig_size.numel() for fp in params if fp.sharded_param.requires_grad)
        padded = sum(fp._sharded_param_data.numel() for fp in params) * int(world)
        counts = ParamCounts(total=total, trainable=trainable, padded_total=padded)
        return config, counts, str(root._device)

    def layout(self) -> Any:
        return state_size(SESSION.cycle.optimizers())

    def private_missing(self) -> list[str]:
        root = self._root()
        if root is None:
            return []
        gone = missing(root, "fsdp2.state")
        if gone:
            return gone
        gone += missing(root._state_ctx, "fsdp2.state_ctx")
        states = getattr(root._state_ctx, "all_states", None) or [root]
        groups = [g for state in states for g in state._fsdp_param_groups]
        for group in groups:
            gone += missing(group, "fsdp2.param_group")
        for fp in self._params() if not gone else ():
            gone += missing(fp, "fsdp2.param")
        return sorted(set(gone))

    def count_grads(self, census: Census) -> None:
        params = self._params()
        census.add("grads", (fp.sharded_param.grad for fp in params), host=self._offloaded(params))

    def count_state(self, census: Census) -> None:
        params = self._params()
        host = self._offloaded(params)
        trainable = [fp for fp in params if fp.sharded_param.requires_grad]
        frozen = [fp for fp in params if not fp.sharded_param.requires_grad]
        census.add("params", (fp._sharded_param_data for fp in trainable), host=host)
        # FSDP2 shards frozen parameters like the others: their shard is P, reported apart.
        census.add("params", (fp._sharded_param_data for fp in frozen), host=host, frozen=True)
        optimizer_state(census, SESSION.cycle.optimizers(), host=host)

    def memory_extras(self, memory: MemoryBytes) -> None:
        gathered = 0
        for fp in self._params():
            if str(getattr(fp, "sharded_state", "")).endswith("UNSHARDED"):
                gathered += sum(local_tensor(t).nbytes for t in fp.all_gather_outputs)
        memory.gathered_params = gathered


def _is_root(state: Any) -> bool:
    """``state._is_root``, read inside the user's forward: if torch renamed it, the forward
    phase and FSDP2's discovery turn off (said once) and the forward runs on untouched."""
    try:
        return bool(state._is_root)
    except Exception as exc:
        SESSION.lost("FSDP2's forward phase", f"FSDPState._is_root is unreadable ({exc!r})")
        return False


def install_state(module: ModuleType) -> None:
    """Wrap ``FSDPState`` (``module`` is torch's ``_fsdp_state``)."""
    state_cls = module.FSDPState
    pre, post = state_cls._pre_forward, state_cls._post_forward

    def _pre_forward(self: Any, mod: Any, args: Any, kwargs: Any) -> Any:
        out = pre(self, mod, args, kwargs)
        if compiled.tracing() or compiled.OUTER[0]:  # see :mod:`.compiled`
            return out
        s = SESSION
        if _is_root(self) and not s.passive:
            try:
                reader = s.reader
                if not isinstance(reader, FSDP2Reader) or reader._root() is not self:
                    # Found at its first forward, whose all-gathers were just issued: keep them.
                    s.found(FSDP2Reader(self), just_built=False)
                s.enter("forward")
                if isinstance(out, tuple) and len(out) == 2:  # the (args, kwargs) forward gets
                    s.model_inputs(mod, out[0], out[1])
            except Exception:
                s.errors += 1
        return out

    def _post_forward(self: Any, mod: Any, args: Any, output: Any) -> Any:
        output = post(self, mod, args, output)
        if compiled.tracing() or compiled.OUTER[0]:
            return output
        if _is_root(self):
            s = SESSION
            s.exit("forward")
            time_backward(output)
        return output

    # torch keeps Dynamo out of FSDP2's hooks (they run eagerly, a skipped call in a compiled
    # graph): the wrappers are kept out the same way, so Dynamo sees what it saw without them.
    disable = getattr(module, "_dynamo_disable", None)
    if disable is not None:
        _pre_forward, _post_forward = disable(_pre_forward), disable(_post_forward)
    patches.replace(state_cls, "_pre_forward", _pre_forward)
    patches.replace(state_cls, "_post_forward", _post_forward)


def _compiled_root(module: Any) -> bool:
    """Whether a compiled module is an FSDP2 root (or, before its first forward, will be one:
    the first state to run forward becomes the root, FSDP2's own rule)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    return get_state is not None and get_state()._is_root is not False


def _find_compiled_root(module: Any) -> None:
    """Before a compiled root's forward: its state is the engine found (as ``_pre_forward``
    finds an eager root's)."""
    s = SESSION
    state = module._get_fsdp_state()
    reader = s.reader
    if not isinstance(reader, FSDP2Reader) or reader._root() is not state:
        s.found(FSDP2Reader(state), just_built=False)


def install_param_group(module: ModuleType) -> None:
    """Name FSDP2's collectives by the module that issues them (``FSDPParamGroup``)."""
    group_cls = module.FSDPParamGroup
    for name in ("unshard", "post_backward"):
        original = getattr(group_cls, name, None)
        if original is None:
            continue

        def named(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> Any:
            log = collectives.LOG
            label = log.label
            log.label = f"FSDP {getattr(self, '_module_fqn', '') or 'root'}"
            try:
                return __original(self, *args, **kwargs)
            finally:
                log.label = label

        patches.replace(group_cls, name, named)


def install() -> None:
    compiled.register(compiled.OWNERS, _compiled_root)
    compiled.register(
        compiled.BEFORE_FORWARD,
        lambda module: _find_compiled_root(module) if _compiled_root(module) else None,
    )
    from . import postimport
    from .install import guarded

    def state_ready(module: ModuleType) -> None:
        guarded("FSDP2", lambda: install_state(module))

    def param_group_ready(module: ModuleType) -> None:
        guarded("FSDP2's collective labels", lambda: install_param_group(module))

    postimport.when_imported("torch.distributed.fsdp._fully_shard._fsdp_state", state_ready)
    postimport.when_imported(
        "torch.distributed.fsdp._fully_shard._fsdp_param_group", param_group_ready
    )
