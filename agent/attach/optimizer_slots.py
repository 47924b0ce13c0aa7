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

import sys
from typing import Any, TypedDict

UNKNOWN = -1

_ZERO_MODULE = "torch.distributed.optim.zero_redundancy_optimizer"


def is_zero(optimizer: Any) -> bool:
    """``optimizer`` is torch's ZeRO-1, ``torch.distributed.optim.ZeroRedundancyOptimizer``:
    it keeps each rank's shard of the state in a local optimizer of the class it was given (its
    ``optim``) and none of its own. Read from the class the job imported (never imported here:
    an optimizer of a module not loaded is not one)."""
    zero = getattr(sys.modules.get(_ZERO_MODULE), "ZeroRedundancyOptimizer", None)
    return zero is not None and isinstance(optimizer, zero)


def sharded_by(optimizer: Any) -> int:
    """Ranks the optimizer's state is sharded over: a ZeroRedundancyOptimizer's group size, 1
    for any other optimizer."""
    if not is_zero(optimizer):
        return 1
    try:
        return max(1, int(optimizer.world_size))
    except Exception:
        return 1


def local_optimizer(optimizer: Any) -> Any:
    """The optimizer that holds this rank's state: a ZeroRedundancyOptimizer's local one
    (stepping this rank's shard of the parameters), else the optimizer itself. Its ``state``
    is O; the outer one's stays empty (O read 0 B for a DDP job under torch's ZeRO-1)."""
    return getattr(optimizer, "optim", optimizer) if is_zero(optimizer) else optimizer


def optimizer_name(optimizer: Any) -> str:
    """The optimizer's class as the config names it: ``ZeroRedundancyOptimizer(AdamW)`` for
    torch's ZeRO-1 (the class its shards step), else the class."""
    if optimizer is None:
        return ""
    local = local_optimizer(optimizer)
    if local is not optimizer:
        return f"{type(optimizer).__name__}({type(local).__name__})"
    return type(optimizer).__name__


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
    """Parameter-sized state tensors ``optimizer`` keeps per parameter, or :data:`UNKNOWN`
    (a ZeroRedundancyOptimizer's: its local optimizer's, per parameter of the shard)."""
    try:
        optimizer = local_optimizer(optimizer)
        rule = SLOTS.get(type(optimizer).__name__)
        groups = getattr(optimizer, "param_groups", None) or []
        if rule is None or not groups:
            return UNKNOWN
        counts = {rule(group) for group in groups}
        return counts.pop() if len(counts) == 1 else UNKNOWN
    except Exception:
        return UNKNOWN


class OptimizerConfig(TypedDict):
    """The ConfigSummary fields a torch loop's optimizers give (:func:`optimizer_config`)."""

    optimizer: str
    optimizer_slots: int
    optimizer_state_elements: int
    no_master_copy: bool


def optimizer_config(optimizers: list[Any]) -> OptimizerConfig:
    """What every reader of torch optimizers (a plain loop, DDP, FSDP, FSDP2) says of them in
    its Hello: their names, slots and state elements; no master copy (torch's optimizers step
    the parameters themselves)."""
    return OptimizerConfig(
        optimizer=optimizers_name(optimizers),
        optimizer_slots=optimizers_slots(optimizers),
        optimizer_state_elements=state_elements(optimizers),
        no_master_copy=True,
    )


def optimizers_name(optimizers: list[Any]) -> str:
    """The loop's optimizers as the Hello names them: one's name, or each joined by ``+`` (a
    loop stepping its matrices with one and the rest with another: ``SGD+AdamW``)."""
    return "+".join(optimizer_name(o) for o in optimizers if o is not None)


def optimizers_slots(optimizers: list[Any]) -> int:
    """:func:`state_slots` of every optimizer, when they agree; :data:`UNKNOWN` otherwise (the
    prediction's one figure per parameter cannot hold a mix) or with none."""
    counts = {state_slots(o) for o in optimizers if o is not None}
    return counts.pop() if len(counts) == 1 else UNKNOWN


def state_elements(optimizers: list[Any]) -> int:
    """Parameter-sized state elements several optimizers keep in all (each group's slots x
    its parameters' elements; ConfigSummary.optimizer_state_elements); 0 for one optimizer,
    one whose slots are unknown, or torch's ZeRO-1 (its local optimizer steps a shard)."""
    live = [o for o in optimizers if o is not None]
    if len(live) < 2 or any(local_optimizer(o) is not o for o in live):
        return 0
    total = 0
    try:
        for optimizer in live:
            rule = SLOTS.get(type(optimizer).__name__)
            if rule is None:
                return 0
            for group in optimizer.param_groups:
                total += rule(group) * sum(p.numel() for p in group["params"])
    except Exception:
        return 0
    return total
