"""How many parameter-sized tensors a torch optimizer keeps per parameter, from its class and
its settings: what the Memory screen's prediction multiplies (the paper's 12 and 8 bytes a
parameter are Adam's, with and without an fp32 master copy).

Read from the settings of the optimizer's parameter groups, never from its state: the
prediction is the formula's, set beside what the census counts. Each slot is a tensor shaped
and typed as its parameter (``torch.zeros_like``, ``grad.clone()``); the per-parameter step
counters (0-dim) are left out, as the formula leaves them. An optimizer not listed here, or
one whose groups differ in a setting that changes the count, is unknown (-1: the prediction
keeps Adam's figure and says nothing it cannot back).
"""

from __future__ import annotations

from typing import Any

UNKNOWN = -1


def _sgd(d: dict[str, Any]) -> int:
    return 1 if d.get("momentum", 0) else 0  # momentum_buffer


def _adam(d: dict[str, Any]) -> int:
    return 3 if d.get("amsgrad", False) else 2  # exp_avg, exp_avg_sq (+ max_exp_avg_sq)


def _rmsprop(d: dict[str, Any]) -> int:
    return 1 + (1 if d.get("momentum", 0) else 0) + (1 if d.get("centered", False) else 0)


SLOTS = {
    "SGD": _sgd,
    "Adam": _adam,
    "AdamW": _adam,
    "Adamax": lambda d: 2,  # exp_avg, exp_inf
    "NAdam": lambda d: 2,
    "RAdam": lambda d: 2,
    "Adadelta": lambda d: 2,  # square_avg, acc_delta
    "Adagrad": lambda d: 1,  # sum
    "RMSprop": _rmsprop,
    "Rprop": lambda d: 2,  # prev, step_size
}
"""torch.optim's classes (torch 2.13) by name: slots from their settings."""


def state_slots(optimizer: Any) -> int:
    """Parameter-sized state tensors ``optimizer`` keeps per parameter, or :data:`UNKNOWN`."""
    try:
        rule = SLOTS.get(type(optimizer).__name__)
        groups = getattr(optimizer, "param_groups", None) or []
        if rule is None or not groups:
            return UNKNOWN
        counts = {rule(group) for group in groups}
        return counts.pop() if len(counts) == 1 else UNKNOWN
    except Exception:
        return UNKNOWN
