"""Parameters used outside their own module's forward, found as the forward runs.

A parameter read in another module's forward (a tied head multiplied in the parent's forward)
is not gathered by its owner's hooks. DeepSpeed finds it with a getter on every module's
``_parameters`` (``ZeROOrderedDict`` in ``parameter_offload.py``) that gathers any partitioned
parameter read during a forward and registers it as external to the innermost module running.

Here the getter only notes the read; the gather waits until an operation uses the parameter's
data. A read for metadata alone (``x.to(self.blocks[0].up.weight.dtype)``, common in model code)
then costs no all-gather and changes nothing in which module fetches what: DeepSpeed's eager
gather on such a read makes the root hold a block's weight, and a rank that runs its blocks in
another order then issues a collective of another size than its peers. The data use is seen by
a ``TorchFunctionMode`` that is on only while some read parameter is still not gathered, and only
in the module calls that read one or were handed one (off for models that never read a parameter
outside its module, and in every other block's forward). Every rank runs the same forward code, so
every rank gathers the same parameter at the same operation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode
from torch.utils._pytree import tree_flatten

_METADATA = frozenset(
    {
        "dtype",
        "device",
        "layout",
        "requires_grad",
        "is_leaf",
        "grad_fn",
        "names",
        "name",
        "is_cuda",
        "is_cpu",
        "is_meta",
        "is_sparse",
        "is_quantized",
        "is_mkldnn",
        "is_nested",
    }
)
"""Tensor attributes that a partitioned parameter answers right without its data (its shape,
``ndim`` and ``numel`` are the released shard's, so reading those gathers)."""

_METADATA_METHODS = frozenset({"__hash__", "is_floating_point", "is_complex", "element_size"})


def _metadata_only(func: Any) -> bool:
    """``func`` reads a tensor's metadata, never its data or shape."""
    name = getattr(func, "__name__", "")
    if name == "__get__":
        return getattr(getattr(func, "__self__", None), "__name__", "") in _METADATA
    return name in _METADATA_METHODS


class WatchedParams(dict[str, Any]):
    """A module's ``_parameters`` whose getter (``nn.Module.__getattr__`` reads parameters
    through it) tells the hooks which parameter a forward read."""

    def __init__(self, items: dict[str, Any], read: Callable[[Any], None]) -> None:
        super().__init__(items)
        self._read = read

    def __getitem__(self, key: str) -> Any:
        value = super().__getitem__(key)
        if value is not None:
            self._read(value)
        return value


class GatherOnUse(TorchFunctionMode):
    """Calls ``use(param)`` before any operation (metadata reads aside) whose arguments hold a
    parameter that was read outside its module and is not gathered yet."""

    def __init__(self, use: Callable[[Any], None]) -> None:
        super().__init__()
        self._use = use
        self.pending: dict[int, Any] = {}
        self._paused = 0
        self._watch: list[bool] = []
        """Per module call running now (innermost last): whether its own code is watched."""
        self._on_stack = False

    @property
    def is_paused(self) -> bool:
        return self._paused > 0

    def _sync(self) -> None:
        """On the stack only while something is pending, the engine is not working and the
        innermost call read a pending parameter or was handed one: a block that neither does
        runs at full speed."""
        want = bool(self.pending) and not self._paused and bool(self._watch) and self._watch[-1]
        if want and not self._on_stack:
            _push_mode(self)
            self._on_stack = True
        elif not want and self._on_stack:
            # Only from the top: a mode the model entered since stays where it is (and this
            # one under it passes every operation through once nothing is pending).
            depth = torch._C._len_torch_function_stack()
            if depth and torch._C._get_function_stack_at(depth - 1) is self:
                _pop_mode()
                self._on_stack = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The engine's own work (gathers and releases write ``param.data``) is no data use;
        the mode leaves the stack meanwhile, so that work runs at full speed."""
        self._paused += 1
        self._sync()
        try:
            yield
        finally:
            self._paused -= 1
            self._sync()

    def enter_call(self, args: Any) -> None:
        """A module call starts: watch it if its inputs hold a pending parameter."""
        handed = bool(self.pending) and any(
            self.pending.get(id(x)) is x for x in tree_flatten(args)[0]
        )
        self._watch.append(handed)
        self._sync()

    def exit_call(self) -> None:
        if self._watch:
            self._watch.pop()
        self._sync()

    def note(self, param: Any) -> None:
        """``param`` was read while not gathered: watch the call running now for its use."""
        self.pending[id(param)] = param
        if self._watch:
            self._watch[-1] = True
        self._sync()

    def stop(self) -> None:
        """The outermost module call ended: forget what was read, leave the mode."""
        self.pending.clear()
        self._watch.clear()
        self._sync()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.pending and not self._paused:
            for value in (*args, *kwargs.values()) if kwargs else args:
                for item in value if isinstance(value, (list, tuple)) else (value,):
                    if self.pending.get(id(item)) is item and not _metadata_only(func):
                        self._use(item)
        return func(*args, **kwargs)
