"""Gradient accumulation's loss scaling, undone for the loss a step shows.

A loop that accumulates gradients over k micro-batches usually hands ``backward()`` the loss
already divided by k (``(loss / k).backward()``; ``accelerate``'s ``Accelerator.backward``
does the division itself), so the tensor the attach reads is a k-th of the loss the script
logs. The division is visible on the tensor itself: its ``grad_fn`` is autograd's
``DivBackward0`` holding the divisor. When every micro-batch of a step was divided by the same
whole number k > 1 and the step had exactly k micro-batches, the step's loss is the mean of
the micro-batch losses times k, which is what the script logs (the mean of its unscaled
micro-batch losses). Anything else (a lone ``loss / 2`` as part of a loss's definition, a last
step of an epoch cut short, a divisor kept on a device, which reading would sync) is left as
handed in. Only a division is read: a product such as ``0.5 * mse`` is part of many losses'
definitions.
"""

from __future__ import annotations

from typing import Any

import torch


def divisor_of(loss: torch.Tensor) -> float:
    """k when ``loss`` is ``x / k`` for a host number k > 1 (whole), else 1. Read before the
    backward that frees the divisor autograd saved; never raises."""
    try:
        fn = loss.grad_fn
        if fn is None or type(fn).__name__ != "DivBackward0":
            return 1.0
        other = getattr(fn, "_saved_other", None)
        if not isinstance(other, torch.Tensor) or other.device.type != "cpu" or other.numel() != 1:
            return 1.0
        # Read past any dispatch mode (the agent's own FLOP counter runs over counted steps,
        # and torch hands a mode a saved number as a Python int, which the op then refuses).
        with torch._C._DisableTorchDispatch():
            k = float(other)
        return k if k > 1 and k == int(k) else 1.0
    except Exception:
        return 1.0


def unscaled(losses: list[tuple[Any, float]], divisor: float) -> list[tuple[Any, float]]:
    """The step's micro-batch losses weighted back by ``divisor`` when it is the step's
    accumulation (see the module docstring); else as they are."""
    if divisor > 1 and len(losses) == divisor and all(w == 1.0 for _, w in losses):
        return [(x, divisor) for x, _ in losses]
    return losses
