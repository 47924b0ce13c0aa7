"""DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR (runtime/lr_schedules.py), same
formulas and defaults, acting on ``optimizer.param_groups[i]["lr"]``.

The engine steps the schedule once per *applied* optimizer step (a step skipped for an fp16
overflow does not advance it), as DeepSpeed's engine does. At construction the lr is set to the
value for iteration -1 (DeepSpeed: the min lr, or ratio 0 for the cosine schedule).
"""

from __future__ import annotations

import math
from typing import Any

from .config_blocks import (
    SchedulerConfig,
    WarmupCosineLRParams,
    WarmupDecayLRParams,
    WarmupLRParams,
)


def _warmup_fraction(iteration: int, warmup_steps: int, warmup_type: str) -> float:
    if warmup_type == "log":
        return math.log(iteration + 1) / math.log(warmup_steps)
    return iteration / warmup_steps


class WarmupSchedule:
    """All three schedules; ``params`` says which."""

    def __init__(self, optimizer: Any, cfg: SchedulerConfig) -> None:
        self.optimizer = optimizer
        self.kind = cfg.type
        p = cfg.params
        self.params = p
        self.warmup_num_steps = max(2, p.warmup_num_steps)
        self.last_batch_iteration = p.last_batch_iteration
        groups = optimizer.param_groups
        if isinstance(p, WarmupCosineLRParams):
            self.org_lrs = [g["lr"] for g in groups]
        else:
            # DeepSpeed: an unset warmup_max_lr is each param group's own lr
            max_lrs = [p.warmup_max_lr if p.warmup_max_lr is not None else g["lr"] for g in groups]
            self.min_lrs = [p.warmup_min_lr] * len(groups)
            self.delta_lrs = [max_lr - p.warmup_min_lr for max_lr in max_lrs]
        if self.last_batch_iteration == -1:
            self._apply()

    def _gamma(self) -> float:
        p = self.params
        assert isinstance(p, WarmupLRParams | WarmupDecayLRParams)
        it = self.last_batch_iteration
        if it < self.warmup_num_steps:
            return _warmup_fraction(it, self.warmup_num_steps, p.warmup_type)
        if isinstance(p, WarmupDecayLRParams):
            return max(
                0.0,
                float(p.total_num_steps - it)
                / float(max(1.0, p.total_num_steps - self.warmup_num_steps)),
            )
        return 1.0

    def _cosine_ratio(self) -> float:
        p = self.params
        assert isinstance(p, WarmupCosineLRParams)
        it = self.last_batch_iteration
        if it < 0:
            return 0.0
        if it < self.warmup_num_steps:
            ratio = _warmup_fraction(it, self.warmup_num_steps, p.warmup_type)
            return p.warmup_min_ratio + ratio * (1.0 - p.warmup_min_ratio)
        real_last_step = it - self.warmup_num_steps + 1
        real_total_steps = max(1, p.total_num_steps - self.warmup_num_steps)
        progress = min(1.0, real_last_step / real_total_steps)
        ratio = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, p.cos_min_ratio + (1.0 - p.cos_min_ratio) * ratio)

    def get_lr(self) -> list[float]:
        """The lr of each param group at ``last_batch_iteration``."""
        if isinstance(self.params, WarmupCosineLRParams):
            r = self._cosine_ratio()
            return [lr * r for lr in self.org_lrs]
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        g = self._gamma()
        return [lo + d * g for lo, d in zip(self.min_lrs, self.delta_lrs)]

    def _apply(self) -> None:
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (
            self.last_batch_iteration + 1 if last_batch_iteration is None else last_batch_iteration
        )
        self._apply()

    def get_last_lr(self) -> list[float]:
        return self._last_lr

    def state_dict(self) -> dict[str, int]:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]
        self._apply()


# DeepSpeed's classes by name and constructor (runtime/lr_schedules.py), for scripts that build a
# schedule themselves and pass it to initialize(lr_scheduler=...); initialize() builds them too.


class WarmupLR(WarmupSchedule):
    def __init__(
        self,
        optimizer: Any,
        warmup_min_lr: float = 0.0,
        warmup_max_lr: float | None = None,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        params = WarmupLRParams(
            warmup_min_lr=warmup_min_lr,
            warmup_max_lr=warmup_max_lr,
            warmup_num_steps=warmup_num_steps,
            warmup_type=warmup_type,  # type: ignore[arg-type]
            last_batch_iteration=last_batch_iteration,
        )
        super().__init__(optimizer, SchedulerConfig(type="WarmupLR", params=params))


class WarmupDecayLR(WarmupSchedule):
    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_min_lr: float = 0.0,
        warmup_max_lr: float | None = 0.001,
        warmup_num_steps: int = 1000,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        params = WarmupDecayLRParams(
            total_num_steps=total_num_steps,
            warmup_min_lr=warmup_min_lr,
            warmup_max_lr=warmup_max_lr,
            warmup_num_steps=warmup_num_steps,
            warmup_type=warmup_type,  # type: ignore[arg-type]
            last_batch_iteration=last_batch_iteration,
        )
        super().__init__(optimizer, SchedulerConfig(type="WarmupDecayLR", params=params))


class WarmupCosineLR(WarmupSchedule):
    def __init__(
        self,
        optimizer: Any,
        total_num_steps: int,
        warmup_min_ratio: float = 0.0,
        warmup_num_steps: int = 1000,
        cos_min_ratio: float = 0.0001,
        warmup_type: str = "log",
        last_batch_iteration: int = -1,
    ) -> None:
        params = WarmupCosineLRParams(
            total_num_steps=total_num_steps,
            warmup_min_ratio=warmup_min_ratio,
            warmup_num_steps=warmup_num_steps,
            cos_min_ratio=cos_min_ratio,
            warmup_type=warmup_type,  # type: ignore[arg-type]
            last_batch_iteration=last_batch_iteration,
        )
        super().__init__(optimizer, SchedulerConfig(type="WarmupCosineLR", params=params))


SCHEDULES: dict[str, type[WarmupSchedule]] = {
    "WarmupLR": WarmupLR,
    "WarmupDecayLR": WarmupDecayLR,
    "WarmupCosineLR": WarmupCosineLR,
}


def schedule_from_config(optimizer: Any, cfg: SchedulerConfig) -> WarmupSchedule:
    """The schedule a ds_config's ``scheduler`` block names, as an instance of DeepSpeed's class
    of that name (accelerate recognizes schedules by class name)."""
    schedule = SCHEDULES[cfg.type].__new__(SCHEDULES[cfg.type])
    WarmupSchedule.__init__(schedule, optimizer, cfg)
    return schedule
