"""Compiled models (``torch.compile``): the attach adds no graph break and no recompile.

Dynamo traces every Python line a compiled module runs, the attach's class-level wrappers
included (``DistributedDataParallel.forward``, FSDP2's forward hooks). A clock read, a hook
registration or a saved-tensor-hooks entry there is a call Dynamo cannot trace: each one splits
the user's graph in two, and the job then runs a different program than without zeroscope.

So every wrapper that can run inside a compiled region first asks :func:`tracing` (torch's
``torch.compiler.is_compiling()``, which Dynamo folds to a constant True: the check itself
adds nothing to the graph) and, when Dynamo is tracing, calls the original and nothing else.
What those wrappers did for an eager model is done from outside the compiled region instead:
``OptimizedModule.__call__`` (what ``torch.compile(model)`` returns; Python runs it before
Dynamo's frame starts) is wrapped at class level, and for a model whose forward is the step's
forward (a DDP model, an FSDP2 root) it times the forward phase, hooks the end of backward on
the output, and finds the FSDP2 root. The saved-tensor hooks that count activations (A) are
entered there too, outside the graph: AOTAutograd's compiled backward saves its tensors
through whatever hooks are active when the compiled forward runs, so A is what the compiled
graph saves, counted as for an eager model. Dynamo guards on those hooks only when they are
inlineable FX graphs (ours are plain functions), so counting some steps and not others
recompiles nothing.

Not measured for compiled models: the bundled engine's per-block activation split (its block
hooks would sit inside the compiled graph: it is NA with the reason), and the forward phase of
a module compiled with ``module.compile()`` whose forward hooks run inside the graph (an FSDP2
root compiled that way: NA, said once).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from types import ModuleType
from typing import Any

from torch.compiler import is_compiling

from . import patches, postimport
from .session import SESSION
from .torch_loop import time_backward

tracing: Callable[[], bool] = is_compiling
"""Whether Dynamo is tracing the calling code (a constant in the traced graph)."""

OWNERS: list[Callable[[Any], bool]] = []
"""Predicates: is this compiled module's forward the step's forward (registered by the DDP and
FSDP2 parts of the attach)."""

INPUTS: list[Callable[[Any], bool]] = []
"""Predicates: the compiled wrapper hands this owned module's micro-batches to the agent (tokens;
FLOPs are NA under compile, agent/work.py). A DDP model's own wrapper would, but runs inside
the compiled region; an FSDP2 root's pre-forward hook runs outside it and does it itself."""

BEFORE_FORWARD: list[Callable[[Any], None]] = []
"""Called with the compiled module before an owned forward (FSDP2 finds its root here)."""

OUTER: list[int] = [0]
"""Owned compiled forwards running now: the inner wrappers then leave the phase to this one
(they also run eagerly when Dynamo falls back to eager for a frame)."""


def register(registry: list[Any], item: Any) -> None:
    """Add ``item`` to one of the registries above until the attach is undone: a part
    installed again after a restore (a rollback, the overhead bench's on/off switch) holds one
    entry, not one per install. (Entries piled up were run at every compiled forward: after
    300 installs, ~150 FSDP2 root checks a DDP step, each a caught AttributeError.)"""
    registry.append(item)

    def unregister() -> None:
        if item in registry:
            registry.remove(item)

    patches.on_restore(unregister)


def _owned(module: Any) -> bool:
    for owns in OWNERS:
        try:
            if owns(module):
                return True
        except Exception:
            SESSION.errors += 1
    return False


def _hands_inputs(module: Any) -> bool:
    try:
        return any(hands(module) for hands in INPUTS)
    except Exception:
        SESSION.errors += 1
        return False


ORIGINAL_FORWARD: list[Callable[[Any], Any]] = []
"""Functions that give a model's unwrapped ``forward`` (the class's own, before the attach
wrapped it at class level) or None: see :func:`_unwrap_forward`."""


def _unwrap_forward(model: Any) -> None:
    """Bind the model's own ``forward`` on the instance being compiled, so Dynamo sees the
    program it sees without zeroscope: ``torch.compile`` picks how it enters a module by
    asking whether its ``forward`` is torch's (DDP's is, the attach's wrapper is not), and it
    traces the forward's code. The compiled model's wrapper times it instead. The binding stays
    when the attach is undone: it is the class's own function, the one restored there."""
    for find in ORIGINAL_FORWARD:
        forward = find(model)
        if forward is not None:
            model.__dict__["forward"] = types.MethodType(forward, model)
            return


def install_optimized(module: ModuleType) -> None:
    """Wrap ``OptimizedModule.__init__`` and ``__call__`` (``module`` is
    ``torch._dynamo.eval_frame``)."""
    cls = module.OptimizedModule
    call, init = cls.__call__, cls.__init__

    def __init__(self: Any, mod: Any, *args: Any, **kwargs: Any) -> None:
        if not SESSION.passive:
            try:
                _unwrap_forward(mod)
            except Exception:
                SESSION.errors += 1
        init(self, mod, *args, **kwargs)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        s = SESSION
        if s.passive or OUTER[0] or tracing():
            return call(self, *args, **kwargs)
        inner = getattr(self, "_orig_mod", None)
        if inner is None or not _owned(inner):
            return call(self, *args, **kwargs)
        for before in BEFORE_FORWARD:
            try:
                before(inner)
            except Exception:
                s.errors += 1
        OUTER[0] += 1
        s.enter("forward")
        if _hands_inputs(inner):
            s.model_inputs(self, args, kwargs)  # the compiled module: its FLOPs are NA
        try:
            out = call(self, *args, **kwargs)
        finally:
            s.exit("forward")
            OUTER[0] -= 1
        time_backward(out)
        return out

    __call__.__doc__, __init__.__doc__ = call.__doc__, init.__doc__
    _keep_out_of_dynamo()
    patches.replace(cls, "__init__", __init__)
    patches.replace(cls, "__call__", __call__)


def _keep_out_of_dynamo() -> None:
    """The attach's own code that Python may enter while a compiled model runs: the import
    hook (a module the model's code imports lazily passes through it), run outside Dynamo so
    it is no frame Dynamo looks at (the job's compiled-frame count stays its own)."""
    import torch

    finder = postimport._Finder
    patches.replace(finder, "find_spec", torch.compiler.disable(finder.find_spec))


def install() -> None:
    from .install import guarded

    def dynamo_ready(module: ModuleType) -> None:
        guarded("compiled models' forward phase", lambda: install_optimized(module))

    postimport.when_imported("torch._dynamo.eval_frame", dynamo_ready)
