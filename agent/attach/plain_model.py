"""The model of a plain loop (no DDP, FSDP or DeepSpeed wrapper: a script's own loop, or an HF
Trainer on one device): found once, at its optimizer's first step, so its forward is timed
like a wrapped engine's.

A wrapper's forward tells the attach which module is the model; a plain loop's optimizer only
holds parameters. Without the model, a single-process job (nanoGPT on one GPU, a script's own
loop, an HF Trainer or TRL's SFTTrainer not distributed) showed no forward phase, no
activations (A), no tokens, FLOPs or MFU ("no model forward seen"), and a LoRA loop's P left
out the frozen base its optimizer does not step. The Trainer names its model (for P's frozen
part) but wraps nothing of it on one device, so its model is searched for as a loop's is.

Found by looking where the loop is: the frames calling ``optimizer.step()`` (their local
variables, and one level into an object's attributes, a trainer class's ``self.model``) for
the module that holds the most of the optimizer's parameters (the outermost of equals). Then,
from the next step on, that module's class ``forward`` is wrapped at class level (as DDP's is:
no hook on the user's object, so a ``torch.save(model)``, a ``deepcopy`` or a pickled
checkpoint carries nothing of zeroscope), acting for that instance only, and it becomes the
session's model (frozen parameters counted in P). Left alone, the model's forward untouched:
a module that is compiled or inside a compiled one in those frames (wrapping it after Dynamo
compiled it would recompile it), a wrapper that has its own reader, or no module found. The
step the model was found in has no forward phase.
"""

from __future__ import annotations

import functools
import sys
import types
import weakref
from typing import Any

import torch

from . import compiled, patches
from .optimizer_slots import local_optimizer
from .session import SESSION
from .torch_loop import optimizer_params, timed_forward

WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "DeepSpeedEngine")
"""Modules whose engines have readers of their own (their forward is wrapped there)."""

_done: list[bool] = []
"""The search ran (once a process, found or not)."""
_watched: list[Any] = []
"""The model whose forward :func:`watch` times (its weak reference)."""


def _holding(module: torch.nn.Module, wanted: set[int]) -> tuple[int, int]:
    """(the optimizer's parameters ``module`` holds, all its parameters)."""
    held = total = 0
    for p in module.parameters():
        total += 1
        held += id(p) in wanted
    return held, total


def _candidates(frame: Any) -> list[Any]:
    """Modules in the frames from ``frame`` outwards: their locals, and one level into the
    attributes of the objects among them (not of classes or imported modules: a script's
    globals hold ``torch`` itself)."""
    found: dict[int, Any] = {}
    while frame is not None:
        for value in list(frame.f_locals.values()):
            try:
                if isinstance(value, torch.nn.Module):
                    found[id(value)] = value
                elif not isinstance(value, (type, types.ModuleType)) and hasattr(value, "__dict__"):
                    for item in list(vars(value).values()):
                        if isinstance(item, torch.nn.Module):
                            found[id(item)] = item
            except Exception:  # an object whose attributes cannot be read: not the model's
                continue
        frame = frame.f_back
    return list(found.values())


def _compiled(module: Any) -> bool:
    return (
        type(module).__name__ == "OptimizedModule"
        or getattr(module, "_compiled_call_impl", None) is not None
    )


FOUND_NOW = (
    "the model's forward was not seen in this step: a plain loop's model is found at its "
    "first optimizer step, and counted from the next"
)
COMPILED = (
    "the model's forward is not seen: the loop's model is compiled (wrapping its forward "
    "would make Dynamo recompile it)"
)
NOT_FOUND = (
    "the model's forward is not seen: no module holding the optimizer's parameters was found "
    "in the frames calling optimizer.step() (docs/engines/plain-loop.md)"
)


def find(optimizer_params: list[Any], frame: Any) -> tuple[Any, str]:
    """The module of the loop whose optimizer steps ``optimizer_params``, or None and why its
    forward will not be seen ("": a wrapper whose own reader sees it, or no parameters): see
    the module docstring."""
    wanted = {id(p) for p in optimizer_params}
    if not wanted:
        return None, ""
    modules = _candidates(frame)
    if any(_compiled(m) for m in modules):
        return None, COMPILED
    best, key = None, (0, 0)
    for module in modules:
        held, total = _holding(module, wanted)
        if held and (held, total) > key:
            best, key = module, (held, total)
    if best is None:
        return None, NOT_FOUND
    if type(best).__name__ in WRAPPERS:
        return None, ""
    return best, ""


def watch(model: torch.nn.Module) -> None:
    """Time ``model``'s forward from now on and make it the session's model."""
    target = weakref.ref(model)
    cls = type(model)
    forward = cls.forward

    def forward_(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Another instance of the class (an EMA copy, a teacher), a compiled region (see
        # :mod:`.compiled`) or a forward inside the model's own: the original, untouched.
        if compiled.tracing() or compiled.OUTER[0] or self is not target():
            return forward(self, *args, **kwargs)
        s = SESSION
        if s.passive or s.tel is None or s.phase_depth("forward"):
            return forward(self, *args, **kwargs)
        return timed_forward(forward, self, self, args, kwargs)

    # The model's own signature, through ``__wrapped__``: an HF Trainer built after this
    # (a second one, or its evaluation's dataloader) keeps the dataset columns the forward's
    # parameters name, read with ``inspect.signature``; a bare (*args, **kwargs) made it drop
    # them all and the job failed ("The batch received was empty").
    functools.update_wrapper(forward_, forward)
    patches.replace(cls, "forward", forward_)
    SESSION.model = target
    _watched.append(target)
    patches.on_restore(_watched.clear)


def discover(optimizer: Any) -> None:
    """At the plain loop's first optimizer step (once a process), or at the first step of a
    model a frontend named and nothing watches yet (each HF Trainer's: a script that trains
    several in turn, a ``model_init`` that makes a new model at ``train()``): find the model
    whose parameters ``optimizer`` steps and watch it. Never raises into the job (a failure is
    counted and the loop runs on unwatched)."""
    s = SESSION
    if s.passive or (s.model is not None and s.model in _watched):
        return
    if _done and s.model is None:
        return  # a loop's model is searched for once
    _done.append(True)
    patches.on_restore(_done.clear)  # installed again (the overhead bench's switch): again
    try:
        params = optimizer_params(local_optimizer(optimizer))
        model, why = find(params, sys._getframe(1))
        # Tokens, FLOPs and MFU NA say why (they showed NA with no reason): for this step
        # only once the model is watched, for every step when it is not.
        meter = getattr(s.tel, "work", None)
        if model is not None:
            watch(model)
            if meter is not None:
                meter.not_seen_this_step(FOUND_NOW)
        elif meter is not None and why:
            meter.unseen = why
    except Exception:
        s.errors += 1
