"""``torch.amp.GradScaler`` and FSDP's ``ShardedGradScaler``: fp16 loops with dynamic loss scaling.

A loop under a scaler hands ``scaler.scale(loss)`` to ``backward()`` (the loss times the scale)
and calls ``scaler.step(optimizer)``, which calls ``optimizer.step()`` only when the unscaled
gradients are finite, then ``scaler.update()``, which lowers the scale after an overflow and
raises it after ``growth_interval`` clean steps. So, for the step it reports:

- the loss is what the loop handed to ``scale()``: read before scaling (``scale`` is wrapped),
  averaged over the step's micro-batches like any plain loop's (a loss divided by the step's
  accumulation, ``scaler.scale(loss / k)`` as Lightning does, undone at the step's end:
  agent/attach/accumulation.py); the scaled tensor given to
  ``backward()`` is not counted (the scaler is the step source, which silences the plain
  loop's loss reading in :mod:`.torch_loop`);
- a step is an iteration that reached ``scaler.step()`` for the loop's primary optimizer,
  applied or skipped, and ends when ``update()`` returns, the new scale set;
- skipped: ``optimizer.step()`` did not run inside ``scaler.step()`` (the scaler decided on the
  host, from its own ``found_inf``); an optimizer that applies the scaling itself (a fused
  one: ``_step_supports_amp_scaling``) always runs, and then the scaler's ``found_inf``
  tensors say it;
- the scale after ``update()`` (and the one in effect for the step's backward, which is the
  previous step's unless the scale tensor changed since) is handed over as it is: on CUDA a
  non-blocking copy the agent's sender thread reads once it has landed, never a device sync;
  on the CPU its value (``snapshot``). The sender thread (agent/loss_scale.py) sets
  ``loss_scale``, ``overflow`` and ``skipped`` and sends the ``overflow``, ``scale_change``
  and ``scale_at_minimum`` events.

A scaler built with ``enabled=False`` is left alone (the optimizer's step ends the step).
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

import torch

from zeroscope.agent.loss_scale import LossScaleReading
from zeroscope.agent.scalars import NO_SCALAR, DeferredScalar

from . import patches
from .accumulation import divisor_of
from .session import SESSION
from .torch_loop import learning_rate, read_by


class _Step:
    """One scaler step between ``step()`` and ``update()``."""

    __slots__ = ("before", "optimizer", "ran", "skipped")

    def __init__(self, optimizer: Any, before: DeferredScalar) -> None:
        self.optimizer = optimizer
        self.before = before
        self.ran = False
        """The optimizer's own ``step()`` ran inside the scaler's."""
        self.skipped: bool | DeferredScalar = False


_pending: weakref.WeakKeyDictionary[Any, _Step] = weakref.WeakKeyDictionary()
"""Scaler -> its step waiting for ``update()``."""
_inside: list[_Step] = []
"""The scaler step now calling the optimizer (at most one: steps do not nest)."""


def snapshot(value: Any) -> DeferredScalar:
    """A scale or flag tensor's value as it is now. A CUDA tensor's copy to pinned host memory
    is queued at once, ahead of any later kernel, and read by the sender thread. A CPU tensor
    is read here: the scaler changes it in place (``_amp_update_scale_``), so the sender could
    only read a copy, and a one-element clone costs the loop more than the read itself (7 us
    against 1 us per value measured with timeit on the 2-vCPU test VM); no device is involved."""
    if not isinstance(value, torch.Tensor):
        return NO_SCALAR
    if value.is_cpu:
        return DeferredScalar(value.item())
    return DeferredScalar(value)


_after: weakref.WeakKeyDictionary[Any, tuple[Any, int, DeferredScalar]] = (
    weakref.WeakKeyDictionary()
)
"""Scaler -> (its scale tensor, that tensor's version, the value) as ``update()`` left them."""


def scale_now(scaler: Any) -> DeferredScalar:
    """The scale in effect now: the one the last ``update()`` left, unless the tensor changed
    since (``load_state_dict``, a new tensor), so that one read per step suffices."""
    scale = getattr(scaler, "_scale", None)
    last = _after.get(scaler)
    if last is not None and last[0] is scale and scale is not None and last[1] == scale._version:
        return last[2]
    return snapshot(scale)


def _found_inf(scaler: Any, optimizer: Any) -> DeferredScalar:
    """The scaler's inf/nan flags for ``optimizer`` this step, summed (nonzero: skipped)."""
    state = scaler._per_optimizer_states[id(optimizer)]
    flags = list(state["found_inf_per_device"].values())
    if not flags:
        return NO_SCALAR
    device = flags[0].device
    total = flags[0] if len(flags) == 1 else sum(f.to(device) for f in flags)
    return snapshot(total)


def _enabled(scaler: Any) -> bool:
    return bool(getattr(scaler, "_enabled", False)) and not SESSION.passive


def _begin(scaler: Any, optimizer: Any) -> _Step | None:
    """``scaler.step(optimizer)`` starts: the step's scale, if this scaler drives steps."""
    s = SESSION
    if s.cycle.primary(optimizer) is not optimizer:
        return None
    s.claim_source("grad-scaler")
    read_by(optimizer)
    if not s.drives("grad-scaler"):
        return None
    s.before_step("grad-scaler")
    return _Step(optimizer, scale_now(scaler))


def _stepped(scaler: Any, step: _Step) -> None:
    """``scaler.step()`` returned: whether the optimizer's step was skipped."""
    if getattr(step.optimizer, "_step_supports_amp_scaling", False):
        step.skipped = _found_inf(scaler, step.optimizer)
    else:
        step.skipped = not step.ran
    _pending[scaler] = step


def _end(scaler: Any, step: _Step) -> None:
    """``scaler.update()`` returned: the step ends with the new scale."""
    scale = getattr(scaler, "_scale", None)
    after = snapshot(scale)
    if scale is not None:
        _after[scaler] = (scale, scale._version, after)
    reading = LossScaleReading(step.before, after, step.skipped)
    SESSION.end_step("grad-scaler", lr=learning_rate(step.optimizer), loss_scale=reading)


def _optimizer_stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global optimizer post-hook: the optimizer ran inside a watched scaler step."""
    if _inside and _inside[-1].optimizer is optimizer:
        _inside[-1].ran = True


def _wrap(cls: type) -> None:
    """Wrap the ``scale``, ``step`` and ``update`` that ``cls`` defines itself."""
    own = cls.__dict__
    if "scale" in own and not patches.is_patched(cls, "scale"):
        scale = own["scale"]

        def scale_(self: Any, outputs: Any) -> Any:
            if _enabled(self) and isinstance(outputs, torch.Tensor):
                s = SESSION
                s.claim_source("grad-scaler")  # the scaled tensor's backward() is not a loss
                if s.drives("grad-scaler"):  # a loss divided for accumulation: undone at
                    s.add_loss(outputs, divisor=divisor_of(outputs))  # the step's end
            return scale(self, outputs)

        scale_.__doc__ = scale.__doc__
        patches.replace(cls, "scale", scale_)
    if "step" in own and not patches.is_patched(cls, "step"):
        step = own["step"]

        def step_(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not _enabled(self) or _inside:
                return step(self, optimizer, *args, **kwargs)
            try:
                watched = _begin(self, optimizer)
            except Exception:
                SESSION.errors += 1
                watched = None
            if watched is None:
                return step(self, optimizer, *args, **kwargs)
            _inside.append(watched)
            s = SESSION
            s.enter("optimizer")
            try:
                out = step(self, optimizer, *args, **kwargs)
            finally:
                s.exit("optimizer")
                _inside.clear()
            try:
                _stepped(self, watched)
            except Exception:
                SESSION.errors += 1
            return out

        step_.__doc__ = step.__doc__
        patches.replace(cls, "step", step_)
    if "update" in own and not patches.is_patched(cls, "update"):
        update = own["update"]

        def update_(self: Any, new_scale: Any = None) -> Any:
            if not _enabled(self):
                return update(self, new_scale)
            watched = _pending.pop(self, None)
            out = update(self, new_scale)
            if watched is not None:
                try:
                    _end(self, watched)
                except Exception:
                    SESSION.errors += 1
            return out

        update_.__doc__ = update.__doc__
        patches.replace(cls, "update", update_)


def install_sharded(module: ModuleType) -> None:
    """FSDP's ``ShardedGradScaler`` (its own ``scale`` and ``update``; ``step`` inherited)."""
    cls = getattr(module, "ShardedGradScaler", None)
    if cls is not None:
        _wrap(cls)


def install() -> None:
    """Wrap ``torch.amp.GradScaler`` now and ``ShardedGradScaler`` once it is imported."""
    from torch.amp.grad_scaler import GradScaler
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from . import postimport

    _wrap(GradScaler)
    patches.on_restore(register_optimizer_step_post_hook(_optimizer_stepped).remove)
    postimport.when_imported("torch.distributed.fsdp.sharded_grad_scaler", install_sharded)
