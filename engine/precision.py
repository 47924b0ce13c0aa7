"""Mixed precision: the loss scalers (DeepSpeed-exact), the overflow check, and the
16-bit <-> fp32 master-weight handling.

Why fp32 master weights: an Adam update of ``lr * m / sqrt(v)`` ~ 1e-5 relative to a weight
rounds to nothing in fp16 or bf16, so the update is applied to an fp32 copy and cast down.
In fp32 training the parameters are their own master (no copy, as DeepSpeed does).

:class:`DynamicLossScaler` follows DeepSpeed's runtime/fp16/loss_scaler.py ``DynamicLossScaler``
(zero-facts §5) step for step. It is pure state: the engine reports its transitions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config_blocks import FP16Config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class LossScaleAtMinimum(RuntimeError):
    """fp16 gradients overflowed with the loss scale already at min_loss_scale."""


@dataclass(kw_only=True, slots=True)
class StaticLossScaler:
    """``fp16.loss_scale > 0`` (or no scaling at all with 1.0 for bf16/fp32)."""

    cur_scale: float = 1.0

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update(self, overflow: bool) -> None:
        """A static scale never moves (an overflowing step is still skipped)."""


@dataclass(kw_only=True, slots=True)
class DynamicLossScaler:
    """``fp16.loss_scale == 0``: halve on overflow (after ``hysteresis`` overflows), double
    after ``scale_window`` overflow-free steps."""

    cur_scale: float = 2.0**16
    scale_factor: float = 2.0
    scale_window: int = 1000
    min_scale: float = 1.0
    delayed_shift: int = 2
    """DeepSpeed's name for ``hysteresis``."""
    consecutive_hysteresis: bool = False
    cur_iter: int = 0
    last_overflow_iter: int = -1
    cur_hysteresis: int = 2

    @classmethod
    def from_config(cls, cfg: FP16Config) -> DynamicLossScaler:
        return cls(
            cur_scale=2.0**cfg.initial_scale_power,
            scale_window=cfg.loss_scale_window,
            min_scale=cfg.min_loss_scale,
            delayed_shift=cfg.hysteresis,
            consecutive_hysteresis=cfg.consecutive_hysteresis,
            cur_hysteresis=cfg.hysteresis,
        )

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update(self, overflow: bool) -> None:
        """Advance one optimizer step; raises :class:`LossScaleAtMinimum` when an overflow
        finds the scale already at its minimum (DeepSpeed stops the run there too)."""
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale:
                    raise LossScaleAtMinimum(
                        f"fp16 gradients overflowed with the loss scale already at its minimum "
                        f"({self.min_scale:g}, fp16.min_loss_scale); cannot decrease it: stopping"
                    )
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            stable_interval = self.cur_iter - self.last_overflow_iter - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1


LossScaler = StaticLossScaler | DynamicLossScaler


def make_loss_scaler(precision: str, fp16: FP16Config) -> LossScaler:
    """The scaler a config asks for: dynamic or static for fp16, scale 1 otherwise."""
    if precision != "fp16":
        return StaticLossScaler(cur_scale=1.0)
    if fp16.dynamic:
        return DynamicLossScaler.from_config(fp16)
    return StaticLossScaler(cur_scale=fp16.loss_scale)


def local_overflow(tensors: list[torch.Tensor], *, device: torch.device) -> torch.Tensor:
    """1.0 if any element of ``tensors`` is inf or nan, else 0.0, as a float32 tensor on
    ``device`` (no host synchronization here; the caller all-reduces MAX, then reads it)."""
    flags = [torch.logical_not(torch.isfinite(t).all()).to(device) for t in tensors if t.numel()]
    if not flags:
        return torch.zeros(1, dtype=torch.float32, device=device)
    return torch.stack(flags).any().to(torch.float32).reshape(1)


def master_copy(shard: torch.Tensor) -> torch.Tensor:
    """The fp32 master of a parameter shard: the shard itself in fp32 training (no second
    copy), else a new fp32 tensor."""
    if shard.dtype == torch.float32:
        return shard
    return shard.detach().to(torch.float32)


def copy_master_to_params(master: torch.Tensor, shard: torch.Tensor) -> None:
    """Cast the updated fp32 master down into the 16-bit parameter shard (no-op when they are
    the same tensor)."""
    if master.data_ptr() != shard.data_ptr():
        shard.copy_(master)
