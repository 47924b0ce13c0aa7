"""DeepSpeed's pipeline engine (``PipelineModule`` + ``engine.train_batch()``, as
Megatron-DeepSpeed and the DeepSpeed pipeline tutorial train).

``PipelineEngine`` is a ``DeepSpeedEngine`` (found by the same ``__init__`` wrapper, read by
the same reader), but it runs a whole step inside ``train_batch()``: its micro-batches'
forwards through ``DeepSpeedEngine.forward`` (timed by the forward wrapper), the last stage's
backwards through ``DeepSpeedEngine.backward``, and the optimizer through its own
``_exec_optimizer_step``, never ``engine.step()``, where the attach ended DeepSpeed's steps. So
a pipeline job reported no step at all ("2 ranks reported, no step completed"). Here:

- ``_exec_optimizer_step`` is the optimizer phase, the gradients counted just before it when
  the memory census is due, as ``step()`` is for the other engines, and ``_exec_backward_pass``
  the backward phase on every stage (the first stages backpropagate with
  ``torch.autograd.backward``); both are entries of the schedule's instruction table
  (``_INSTRUCTION_MAP``), wrapped there;
- ``train_batch()`` returning is the step's end (when DeepSpeed's step count moved), with its
  loss: the value ``train_batch()`` returns, the mean over the step's micro-batches averaged
  over the data-parallel replicas and broadcast to every stage by DeepSpeed, what the script
  itself reads (every rank reports it, where only the last stage computes a loss);
- the step's samples are counted on the first stage only (each stage of a replica passes the
  same micro-batches: counted on every stage, samples/s read as many times the real rate);
- the rank's stage, replica and model-parallel slice, from the engine's process grid, go in its
  Hello at the first ``train_batch()`` (agent/attach/pipeline_layout.py: each stage is judged
  against its own replicas, not against the other stages).
"""

from __future__ import annotations

import weakref
from functools import partial
from types import ModuleType
from typing import Any

import torch

from . import patches
from .session import SESSION


def _say_grid(engine: Any) -> None:
    """This rank's stage, replica and slice from DeepSpeed's process grid, in its Hello."""
    from .pipeline_layout import grid_layout

    try:
        SESSION.set_layout(grid_layout(engine))
    except Exception as exc:
        SESSION.lost("the stages of DeepSpeed's pipeline engine", f"unreadable ({exc!r})")


def install_pipeline(module: ModuleType) -> None:
    """Wrap ``PipelineEngine.train_batch`` and its optimizer step (``module``: deepspeed)."""
    from .deepspeed_engine import _loss_scale, _step_end

    engine_cls = getattr(module, "PipelineEngine", None)
    if engine_cls is None:
        return
    train_batch = engine_cls.train_batch
    told: weakref.WeakSet[Any] = weakref.WeakSet()
    optimizer_step = engine_cls._exec_optimizer_step
    backward_pass = engine_cls._exec_backward_pass

    def _exec_optimizer_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        s = SESSION
        if not s.drives("deepspeed"):
            return optimizer_step(self, *args, **kwargs)
        s.before_step("deepspeed")
        with s.phase("optimizer"):
            return optimizer_step(self, *args, **kwargs)

    def _exec_backward_pass(self: Any, *args: Any, **kwargs: Any) -> Any:
        # The first stages backpropagate with torch.autograd.backward (the last one through
        # DeepSpeedEngine.backward, whose own phase nests in this one and counts once).
        with SESSION.phase("backward"):
            return backward_pass(self, *args, **kwargs)

    def train_batch_(self: Any, *args: Any, **kwargs: Any) -> Any:
        s = SESSION
        if not s.drives("deepspeed"):
            return train_batch(self, *args, **kwargs)
        if self not in told:  # once per engine, read or not
            told.add(self)
            _say_grid(self)
        try:  # the lr this step's update uses: the scheduler moves on inside the step
            steps, skipped, scale = self.global_steps, self.skipped_steps, _loss_scale(self)
            lr = self.get_lr()
        except Exception:
            s.errors += 1
            return train_batch(self, *args, **kwargs)
        out = train_batch(self, *args, **kwargs)
        if self.global_steps != steps:
            figures: dict[str, Any] = {}
            if isinstance(out, torch.Tensor) and out.numel() == 1:
                figures["loss"] = out.detach()
            first = bool(self.is_first_stage())
            samples = (
                int(self.train_micro_batch_size_per_gpu()) * int(self.gradient_accumulation_steps())
                if first
                else 0
            )
            _step_end(self, skipped, scale, lr, samples, **figures)
        return out

    train_batch_.__doc__ = train_batch.__doc__
    patches.replace(engine_cls, "train_batch", train_batch_)
    # The schedule runs its instructions from a table of the class's functions, made when the
    # class was defined (``_INSTRUCTION_MAP``): the table's entries are what must be wrapped.
    table = engine_cls._INSTRUCTION_MAP
    for original, wrapper in (
        (optimizer_step, _exec_optimizer_step),
        (backward_pass, _exec_backward_pass),
    ):
        wrapper.__doc__ = original.__doc__
        patches.replace(engine_cls, original.__name__, wrapper)
        keys = [k for k, fn in table.items() if fn is original]
        if not keys:
            raise LookupError(f"PipelineEngine._INSTRUCTION_MAP has no {original.__name__}")
        for key in keys:
            table[key] = wrapper
            patches.on_restore(partial(table.__setitem__, key, original))
