"""The gradient norm of a loop that clips: what ``torch.nn.utils.clip_grad_norm_`` returned.

DeepSpeed says its norm (``get_global_grad_norm()``, agent/attach/deepspeed_engine.py); every
other job zeroscope attaches to showed ``grad norm NA``, though nearly every LLM script clips
and the norm is the figure a loss spike is read against: nanoGPT and Lightning call
``torch.nn.utils.clip_grad_norm_``; accelerate's ``clip_grad_norm_`` (an HF Trainer's) and
torchtitan work the total norm out themselves (``get_total_norm``) and hand it to
``torch.nn.utils.clip_grads_with_norm_``; FSDP1 clips with its own method,
``FullyShardedDataParallel.clip_grad_norm_`` (an HF Trainer's ``--fsdp``, through accelerate),
which returns the norm it all-reduced. The two functions are wrapped where they live (the
``torch.nn.utils`` package and its ``clip_grad`` module, before the script imports either
name), and the norm is kept for the step's report: the total norm of the gradients before
clipping, as torch returns it and as DeepSpeed reports its own. The last clip before the step's
end is the step's (a loop of two optimizers that clips each reports the later one's).

The norm is a tensor on the gradients' device: the report reads it as it reads the loss
(agent/scalars.py: on CUDA a non-blocking copy read once it landed, never a device sync). An
FSDP2 norm is a DTensor: replicated (torch 2.13 returns it so) its local value is the whole
norm; a partial one would need a collective to read, so the step's norm stays NA. Under
GradScaler the loop unscales first, so the norm is of the true gradients; in a step that
overflowed it is inf or nan, as the loop's own is. Clipping inside a compiled region (a
train step under ``torch.compile``) runs torch's function alone, nothing added to the graph
(agent/attach/compiled.py): that step's norm is NA.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import compiled, patches
from .losses import readable_scalar
from .session import SESSION


def note(norm: Any) -> None:
    """Keep ``norm`` as the step's gradient norm (never raises into the job)."""
    s = SESSION
    if s.passive:
        return
    try:
        s.grad_norm = readable_scalar(norm) if isinstance(norm, torch.Tensor) else None
    except Exception:
        s.errors += 1


def _clip_grad_norm(original: Any) -> Any:
    @functools.wraps(original)
    def clip_grad_norm_(*args: Any, **kwargs: Any) -> Any:
        before = SESSION.grad_norm
        norm = original(*args, **kwargs)
        # torch's clip_grad_norm_ hands its norm to clip_grads_with_norm_, wrapped too: kept
        # there already (a new tensor), it is not read twice. FSDP1's clips by itself.
        if SESSION.grad_norm is before and not compiled.tracing():
            note(norm)  # (inside a compiled step: nothing added to its graph)
        return norm

    return clip_grad_norm_


def _clip_grads_with_norm(original: Any) -> Any:
    @functools.wraps(original)
    def clip_grads_with_norm_(*args: Any, **kwargs: Any) -> Any:
        done = original(*args, **kwargs)
        if not compiled.tracing():
            note(kwargs.get("total_norm", args[2] if len(args) > 2 else None))
        return done

    return clip_grads_with_norm_


def install() -> None:
    """Wrap both functions in ``torch.nn.utils`` and wherever ``torch.nn.utils.clip_grad``
    holds them (torch 2.13 exports its ``_clip_grads_with_norm_`` as
    ``clip_grads_with_norm_``, and ``clip_grad_norm_`` calls it by its private name)."""
    from torch.nn.utils import clip_grad

    for name, wrap in (
        ("clip_grad_norm_", _clip_grad_norm),
        ("clip_grads_with_norm_", _clip_grads_with_norm),
    ):
        original = getattr(torch.nn.utils, name, None)
        if original is None:  # (clip_grads_with_norm_ is torch 2.6's)
            continue
        wrapped = wrap(original)
        patches.replace(torch.nn.utils, name, wrapped)
        for held, value in list(vars(clip_grad).items()):
            if value is original:
                patches.replace(clip_grad, held, wrapped)
    from . import postimport
    from .install import guarded

    def fsdp1(module: Any) -> None:
        cls = module.FullyShardedDataParallel
        guarded(
            "the gradient norm of FSDP's clip_grad_norm_",
            lambda: patches.replace(cls, "clip_grad_norm_", _clip_grad_norm(cls.clip_grad_norm_)),
        )

    postimport.when_imported("torch.distributed.fsdp.fully_sharded_data_parallel", fsdp1)
