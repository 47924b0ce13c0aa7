"""Module hooks that gather parameters just in time, in forward and again in backward.

Forward is plain module hooks: the pre-hook fetches the module's parameters, the post-hook
releases them. Backward has no module-level "before" and "after" that always fire, so, as
DeepSpeed does in ``parameter_offload.py`` (PreBackwardFunction / PostBackwardFunction), two
identity autograd Functions are spliced into the graph during forward:

- around the module's *outputs*: its backward runs when the gradients of the outputs arrive,
  i.e. just before the module's own backward -> fetch the parameters again;
- around the module's *inputs*: its backward runs when the gradients of the inputs are done,
  i.e. just after the module's backward -> release them.

A module whose inputs need no gradient (an embedding fed token ids) never gets the second call;
its parameters are released at the end of backward with everything else. Autograd runs a
parameter's AccumulateGrad before other ready nodes, so its gradient is taken (hooks in
``grads``) before the release can run.

A parameter read outside its own module (a tied head multiplied in the parent's forward) is
found as DeepSpeed finds it, by a getter on every module's ``_parameters``, and gathered when an
operation uses its data (``external.py`` says why not at the read).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten
from torch.utils.hooks import RemovableHandle

from .coordinator import ParameterCoordinator
from .external import GatherOnUse, WatchedParams
from .linear import patch_linears, unpatch_linears


class _RunBeforeBackward(torch.autograd.Function):
    """Identity on the module's outputs; its backward calls ``callback`` first."""

    @staticmethod
    def forward(ctx: Any, callback: Callable[[], None], *tensors: torch.Tensor) -> Any:
        ctx.callback = callback
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        ctx.callback()
        return (None, *grads)


class _RunAfterBackward(torch.autograd.Function):
    """Identity on the module's inputs; its backward (the module's backward is done) calls
    ``callback``."""

    @staticmethod
    def forward(ctx: Any, callback: Callable[[], None], *tensors: torch.Tensor) -> Any:
        ctx.callback = callback
        return tuple(t.detach() for t in tensors)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        ctx.callback()
        return (None, *grads)


def _splice(fn: type[torch.autograd.Function], callback: Callable[[], None], value: Any) -> Any:
    """Route every tensor in ``value`` that requires grad through one ``fn`` node."""
    leaves, spec = tree_flatten(value)
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
    if not where:
        return value
    outs = fn.apply(callback, *(leaves[i] for i in where))
    for i, out in zip(where, outs):
        leaves[i] = out
    return tree_unflatten(leaves, spec)


class Stage3Hooks:
    """Installs the fetch/release hooks on every module that owns parameters."""

    def __init__(self, root: nn.Module, coordinator: ParameterCoordinator) -> None:
        self.coordinator = coordinator
        self._ids = itertools.count()
        self._running: list[tuple[nn.Module, int, int]] = []
        """The module calls running now, innermost last: (module, forward use id, backward use
        id); a parameter read while not gathered is registered to the innermost one."""
        self._depth = 0
        self.handles: list[RemovableHandle] = [
            root.register_forward_pre_hook(self._start_of_forward, prepend=True),
            root.register_forward_hook(self._end_of_forward),
        ]
        for module in root.modules():
            self.handles.append(
                module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            )
            self.handles.append(module.register_forward_hook(self._post_forward))
        self.linears = patch_linears(root)
        self._gather_on_use = GatherOnUse(self._used)
        self._watched = list(root.modules())
        for module in self._watched:
            module._parameters = WatchedParams(module._parameters, self._read)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        unpatch_linears(self.linears)
        self._gather_on_use.stop()
        for module in self._watched:
            if isinstance(module._parameters, WatchedParams):
                module._parameters = dict(module._parameters)

    def _read(self, param: Any) -> None:
        """A forward read ``param``: if it is not gathered, gather it at its first data use."""
        if (
            self._running
            and not self._gather_on_use.is_paused
            and self.coordinator.not_gathered(param)
        ):
            self._gather_on_use.note(param)

    def _used(self, param: Any) -> None:
        """An operation uses ``param``'s data: gather it for the module running now."""
        if self._running:
            module, use_id, _ = self._running[-1]
            self.coordinator.fetch_external(module, param, use_id)

    def _start_of_forward(self, module: nn.Module, args: Any) -> None:
        if self._depth == 0:
            self.coordinator.reset_step()
            self._running.clear()  # a forward that raised left its calls here
            self._gather_on_use.stop()
        self._depth += 1

    def _end_of_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self._depth -= 1

    def _pre_forward(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        with self._gather_on_use.paused():
            return self._fetch_for_forward(module, args, kwargs)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> Any:
        with self._gather_on_use.paused():
            return self._release_after_forward(module, output)

    def _fetch(self, module: nn.Module, use_id: int) -> None:
        with self._gather_on_use.paused():
            self.coordinator.fetch(module, use_id)

    def _release(self, module: nn.Module, use_id: int) -> None:
        with self._gather_on_use.paused():
            self.coordinator.release(module, use_id)

    def _fetch_for_forward(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        use_id, backward_id = next(self._ids), next(self._ids)
        self._running.append((module, use_id, backward_id))
        self._gather_on_use.enter_call((args, kwargs))
        if not self.coordinator.params_of(module):
            return None
        self.coordinator.fetch(module, use_id)
        if not torch.is_grad_enabled():
            return None
        # Keyword inputs too (transformers pass hidden states by keyword), all through one node.
        return _splice(
            _RunAfterBackward, lambda: self._release(module, backward_id), (args, kwargs)
        )

    def _release_after_forward(self, module: nn.Module, output: Any) -> Any:
        _, use_id, backward_id = self._running.pop()
        self._gather_on_use.exit_call()
        if not self._running:
            self._gather_on_use.stop()
        # (found now even when the pre-hook had none: an external parameter read in this call)
        if not self.coordinator.params_of(module):
            return None
        self.coordinator.release(module, use_id)
        if not torch.is_grad_enabled():
            return None
        return _splice(_RunBeforeBackward, lambda: self._fetch(module, backward_id), output)
