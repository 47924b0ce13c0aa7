"""``deepspeed.utils``: ``logger`` (DeepSpeed's logger, named "DeepSpeed"), ``log_dist``,
``RepeatingLoader``, ``set_z3_leaf_modules``, ``is_initialized``, ``zero_to_fp32``."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import torch.distributed as dist
from torch import nn

logger = logging.getLogger("DeepSpeed")
"""The logger DeepSpeed logs to (the Hugging Face Trainer sets its level)."""


def log_dist(message: str, ranks: list[int] | None = None, level: int = logging.INFO) -> None:
    """Log ``message`` on the given ranks (all with ``[-1]``; rank 0 when None, as DeepSpeed)."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    ranks = ranks if ranks is not None else [0]
    if -1 in ranks or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}")


class RepeatingLoader:
    """DeepSpeed's ``RepeatingLoader``: iterate ``loader`` forever, restarting it when it ends."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader
        self.data_iter: Iterator[Any] = iter(loader)

    def __iter__(self) -> RepeatingLoader:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


def is_initialized() -> bool:
    """Whether torch.distributed is initialized (DeepSpeed re-exports comm's)."""
    return dist.is_available() and dist.is_initialized()


def set_z3_leaf_modules(model: nn.Module, leaf_module_classes: list[Any]) -> list[nn.Module]:
    """DeepSpeed marks modules whose parameters stage 3 fetches as one unit (mixtures of experts
    use it). The engine's stage-3 coordinator follows whatever order a step uses, so the mark
    changes nothing here; the marked modules are returned as DeepSpeed returns them."""
    names = {c if isinstance(c, str) else c.__name__ for c in leaf_module_classes}
    marked = [m for m in model.modules() if type(m).__name__ in names]
    for module in marked:
        module._z3_leaf = True  # type: ignore[assignment]
    return marked


def get_z3_leaf_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if getattr(m, "_z3_leaf", False)]


def __getattr__(name: str) -> Any:
    if name == "zero_to_fp32":
        return importlib.import_module(f"{__name__}.zero_to_fp32")
    raise AttributeError(f"module 'deepspeed.utils' (zeroscope's engine) has no attribute {name!r}")


__all__ = [
    "RepeatingLoader",
    "get_z3_leaf_modules",
    "is_initialized",
    "log_dist",
    "logger",
    "set_z3_leaf_modules",
]
