"""The training engine DeepSpeed users know: ``engine(batch)``, ``engine.backward(loss)``,
``engine.step()``, with gradient accumulation, mixed precision and a ZeRO strategy.

The optimizer step reads as phases (nanochat's shape):

1. wait for this rank's averaged gradient shards (reductions may have overlapped backward);
2. fp16: agree on overflow across ranks (all-reduce MAX); on overflow skip the step (masters
   and Adam state untouched), update the loss scaler, forget the gradients;
3. unscale into fp32, global L2 norm (all-reduce of the sum of squares when sharded), clip
   like ``torch.nn.utils.clip_grad_norm_`` (coefficient ``clip / (norm + 1e-6)`` clamped at 1);
4. Adam(W) on each fp32 master shard; cast down and all-gather the parameters;
5. advance the loss scaler and the LR schedule (skipped steps do not advance the schedule,
   as in DeepSpeed's engine), report the step.

Unlike DeepSpeed 0.19 at stage 0 with bf16/fp16, no optimizer step is taken at start-up.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from .comm import Comm
from .config import DeepSpeedConfig
from .optim import ZeroOptimizer, adam_step
from .precision import LossScaleAtMinimum, LossScaler, local_overflow
from .report import Reporter
from .zero.strategy import ZeroStrategy

log = logging.getLogger("zeroscope.engine")


class ZeroEngine:
    """Wraps the user's module; see the module docstring for one optimizer step."""

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        config: DeepSpeedConfig,
        strategy: ZeroStrategy,
        optimizer: ZeroOptimizer,
        lr_scheduler: Any,
        comm: Comm,
        reporter: Reporter,
        scaler: LossScaler,
        device: torch.device,
    ) -> None:
        self.module = module
        self.config = config
        self.strategy = strategy
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.comm = comm
        self.reporter = reporter
        self.scaler = scaler
        self.device = device
        self.global_steps = 0
        self.global_samples = 0
        self.micro_steps = 0
        self.skipped_steps = 0
        self._loss_sum: torch.Tensor | None = None
        self._grad_norm: torch.Tensor | None = None

    # -- DeepSpeed's accessors -----------------------------------------------------------------

    def train_batch_size(self) -> int:
        return self.config.train_batch_size or 0

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.micro_batch

    def gradient_accumulation_steps(self) -> int:
        return self.config.accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self.config.zero_optimization.stage

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        return None if self._grad_norm is None else float(self._grad_norm)

    @property
    def loss_scale(self) -> float:
        return self.scaler.loss_scale

    @property
    def local_rank(self) -> int:
        return self.device.index or 0

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the current micro-batch completes an optimizer step."""
        return (self.micro_steps + 1) % self.config.accumulation_steps == 0

    def train(self, mode: bool = True) -> ZeroEngine:
        self.module.train(mode)
        return self

    def eval(self) -> ZeroEngine:
        self.module.eval()
        return self

    def parameters(self, recurse: bool = True) -> Any:
        return self.module.parameters(recurse)

    # -- checkpoints (engine/checkpoint_files.py) and clean-up --------------------------------

    def save_checkpoint(
        self,
        save_dir: str,
        tag: str | None = None,
        client_state: dict[str, Any] | None = None,
        save_latest: bool = True,
    ) -> bool:
        from .checkpoint_files import save_checkpoint

        return save_checkpoint(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir: str, tag: str | None = None, **options: Any) -> Any:
        from .checkpoint_files import load_checkpoint

        return load_checkpoint(self, load_dir, tag, **options)

    def destroy(self) -> None:
        """Release what the strategy holds outside the process (NVMe swap files)."""
        close = getattr(self.strategy, "close", None)
        if close is not None:
            close()

    def save_16bit_model(self, save_dir: str, save_filename: str = "model.safetensors") -> bool:
        """DeepSpeed's ``save_16bit_model``: the full 16-bit weights in one safetensors file,
        written by rank 0; every rank must call it. At stage 3 it needs
        ``stage3_gather_16bit_weights_on_model_save`` (else it logs why and returns False)."""
        save = getattr(self.strategy, "save_16bit_model", None)
        if save is not None:
            saved = bool(save(save_dir, save_filename))
            if not saved:  # stage 3 without gathering: the advisor names the fix
                self.reporter.tel.event(
                    "checkpoint",
                    "save_16bit_model skipped: stage3_gather_16bit_weights_on_model_save is off",
                    value=0.0,
                )
            return saved
        if self.comm.rank == 0:  # stages 0-2: every rank holds the full parameters
            from .safetensors_file import write_safetensors

            os.makedirs(save_dir, exist_ok=True)
            write_safetensors(os.path.join(save_dir, save_filename), self.module.state_dict())
        return True

    # -- the loop ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.reporter.phase("forward"):
            return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """Backward of ``loss / gradient_accumulation_steps``, times the loss scale."""
        with self.reporter.phase("backward"):
            self.strategy.begin_micro_step(boundary=self.is_gradient_accumulation_boundary())
            detached = loss.detach().float()
            self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
            factor = self.scaler.loss_scale / self.config.accumulation_steps
            scaled = loss.float() * factor if factor != 1.0 else loss
            scaled.backward(retain_graph=retain_graph)
            self.strategy.end_micro_step()
        return loss

    def step(self) -> None:
        """At an accumulation boundary: the optimizer step; always: count the micro-batch."""
        if self.is_gradient_accumulation_boundary():
            with self.reporter.phase("optimizer"):
                self._take_model_step()
        self.micro_steps += 1

    def _take_model_step(self) -> None:
        scale = self.scaler.loss_scale
        # 1. this rank's averaged gradient shards
        grads = self.strategy.reduced_grads()
        # 2. overflow, agreed by every rank
        overflow = False
        if self.config.precision == "fp16":
            flag = local_overflow(grads).to(grads[0].device if grads else self.device)
            if self.strategy.sharded:  # at stage 0 every rank checks the same averaged grads
                self.comm.all_reduce(flag, op=dist.ReduceOp.MAX, label="overflow").wait()
            overflow = bool(flag.item())
        if overflow:
            self._skip(scale)
            return
        # 3. unscale, global norm, clip
        grads32 = [g.float() for g in grads]
        if scale != 1.0:
            for g in grads32:
                g.mul_(1.0 / scale)
        sq = torch.zeros(1, dtype=torch.float32, device=self.device)
        for g in grads32:
            sq += g.pow(2).sum()
        if self.strategy.sharded:
            self.comm.all_reduce(sq, label="grad_norm").wait()
        norm = sq.sqrt()
        clip = self.config.gradient_clipping
        if clip > 0:
            coef = torch.clamp(clip / (norm + 1e-6), max=1.0)
            for g in grads32:
                g.mul_(coef)
        # 4. Adam on the fp32 masters, then the parameters
        offloaded_step = getattr(self.strategy, "optimizer_step", None)
        if offloaded_step is not None:  # offload (engine/offload.py): Adam where O lives
            offloaded_step(grads32, self.optimizer.hyper)
        else:
            for shard, g in zip(self.strategy.shards, grads32):
                adam_step(shard.master, g, shard.state, self.optimizer.hyper(shard.group))
        del grads32
        self.strategy.publish_params()
        memory = self.strategy.memory()
        self.strategy.zero_grads()
        # 5. scaler, schedule, report
        self.scaler.update(False)
        self.reporter.scale_change(scale, self.scaler.loss_scale)
        lr = self.get_lr()[0]
        if self.lr_scheduler is not None:
            # torch's schedulers warn unless they saw their optimizer's step() run; the engine
            # applied the update itself just now, so tell them it happened.
            scheduled = getattr(self.lr_scheduler, "optimizer", None)
            if scheduled is not None:
                scheduled._opt_called = True
            self.lr_scheduler.step()
        self._grad_norm = norm
        self._finish_step(memory=memory, lr=lr, grad_norm=norm, scale=scale, overflow=False)

    def _skip(self, scale: float) -> None:
        """An overflowing fp16 step: nothing is applied; the scaler decides the next scale."""
        self.reporter.overflow(scale)
        memory = self.strategy.memory()
        self.strategy.zero_grads()
        try:
            self.scaler.update(True)
        except LossScaleAtMinimum:
            self.reporter.scale_at_minimum(scale)
            raise
        self.reporter.scale_change(scale, self.scaler.loss_scale)
        self.skipped_steps += 1
        self._grad_norm = None
        self._finish_step(
            memory=memory, lr=self.get_lr()[0], grad_norm=None, scale=scale, overflow=True
        )

    def _finish_step(
        self, *, memory: Any, lr: float, grad_norm: Any, scale: float, overflow: bool
    ) -> None:
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        loss = None
        if self._loss_sum is not None:
            loss = self._loss_sum / self.config.accumulation_steps
        self._loss_sum = None
        fp16 = self.config.precision == "fp16"
        self.reporter.step_end(
            memory=memory,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            loss_scale=scale if fp16 else None,
            overflow=overflow,
            skipped=overflow,
            # This rank's share of the batch, not the global batch: the viewer adds ranks up.
            samples=self.config.micro_batch * self.config.accumulation_steps,
        )
        every = self.config.steps_per_print
        if self.comm.rank == 0 and every > 0 and self.global_steps % every == 0:
            log.info(
                "step %d loss %s lr %.3g%s",
                self.global_steps,
                "NA" if loss is None else f"{float(loss):.4f}",
                lr,
                f" loss_scale {self.scaler.loss_scale:g}" if fp16 else "",
            )
