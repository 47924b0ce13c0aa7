"""The training engine DeepSpeed users know: ``engine(batch)``, ``engine.backward(loss)``,
``engine.step()``, with gradient accumulation, mixed precision and a ZeRO strategy.

The optimizer step reads as phases (nanochat's shape):

1. wait for this rank's averaged gradient shards (reductions may have overlapped backward);
2. fp16 (and bf16 at stages 1-2, DeepSpeed's ``bf16.check_grad_overflow``): agree on overflow
   across ranks (all-reduce MAX); on overflow skip the step (masters and Adam state
   untouched), update the loss scaler, forget the gradients;
3. unscale into fp32, global L2 norm (all-reduce of the sum of squares when sharded), clip
   like ``torch.nn.utils.clip_grad_norm_`` (coefficient ``clip / (norm + 1e-6)`` clamped at 1);
4. Adam(W) on each fp32 master shard; cast down and all-gather the parameters;
5. advance the loss scaler and the LR schedule (skipped steps do not advance the schedule,
   as in DeepSpeed's engine), report the step.

Unlike DeepSpeed 0.19 at stage 0 with bf16/fp16, no optimizer step is taken at start-up.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist

from .config import DeepSpeedConfig
from .engine_accessors import EngineAccessors
from .engine_calls import EngineCalls
from .optim import ZeroOptimizer, adam_step
from .precision import LossScaleAtMinimum, LossScaler, local_overflow
from .process_group import Comm
from .report import Reporter
from .zero.strategy import ZeroStrategy

log = logging.getLogger("zeroscope.engine")


class ZeroEngine(EngineAccessors, EngineCalls):
    """Wraps the user's module; see the module docstring for one optimizer step.

    ``config`` is the ds_config as a dict (DeepSpeed's ``engine.config``, read with ``.get`` by
    the Hugging Face integration); ``_config`` is the typed, resolved :class:`DeepSpeedConfig`
    (DeepSpeed's own name for its config object). DeepSpeed's read-only accessors live in
    :class:`~.engine_accessors.EngineAccessors`, its calls around the loop (saving, no_sync,
    ...) in :class:`~.engine_calls.EngineCalls`."""

    def __init__(
        self,
        *,
        module: torch.nn.Module,
        config: DeepSpeedConfig,
        raw_config: dict[str, Any] | None = None,
        strategy: ZeroStrategy,
        optimizer: ZeroOptimizer,
        lr_scheduler: Any,
        comm: Comm,
        reporter: Reporter,
        scaler: LossScaler,
        device: torch.device,
    ) -> None:
        self.module = module
        self._config = config
        self.config: dict[str, Any] = raw_config if raw_config is not None else {}
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
        self.training_dataloader: Any = None
        self._boundary_override: bool | None = None
        self._inside_no_sync = False
        self._step_applied = False
        self._loss_sum: torch.Tensor | None = None
        self._grad_norm: torch.Tensor | None = None

    # -- gradient accumulation boundary ------------------------------------------------------

    def is_gradient_accumulation_boundary(self) -> bool:
        """True when the current micro-batch completes an optimizer step: counted from the
        micro-steps, unless :meth:`set_gradient_accumulation_boundary` said otherwise."""
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self._config.accumulation_steps == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """DeepSpeed's manual boundary: set before each backward; the last micro-batch's
        backward has it True and ``step()`` is called once after it (accelerate drives the engine
        this way, calling ``step()`` only at boundaries)."""
        self._boundary_override = bool(is_boundary)

    def was_step_applied(self) -> bool:
        """Whether the latest ``step()`` changed the parameters (False between boundaries and
        on an fp16 overflow)."""
        return self._step_applied

    # -- the loop ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.reporter.phase("forward"):
            self.reporter.model_inputs(self.module, args, kwargs)
            return self.module(*args, **kwargs)

    def backward(
        self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True
    ) -> torch.Tensor:
        """Backward of ``loss / gradient_accumulation_steps`` (``loss`` as given when
        ``scale_wrt_gas`` is False: the Hugging Face Trainer normalizes it itself), times the
        loss scale. Returns the loss divided by the accumulation steps, as DeepSpeed does.

        The step's reported loss is the sum of these returned values over the step's
        micro-batches: the mean micro-batch loss either way (a loss the caller already divided
        by the accumulation steps is not divided again), which is what the Hugging Face Trainer
        logs from the same values."""
        gas = self._config.accumulation_steps if scale_wrt_gas else 1
        with self.reporter.phase("backward"):
            boundary = self.is_gradient_accumulation_boundary() and not self._inside_no_sync
            self.strategy.begin_micro_step(boundary=boundary)
            detached = loss.detach().float() / gas
            self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached
            factor = self.scaler.loss_scale / gas
            scaled = loss.float() * factor if factor != 1.0 else loss
            scaled.backward(retain_graph=retain_graph)
            self.strategy.end_micro_step()
        return loss / gas if gas != 1 else loss

    def step(self, lr_kwargs: dict[str, Any] | None = None) -> None:
        """At an accumulation boundary: the optimizer step; always: count the micro-batch.
        ``lr_kwargs`` are passed to the LR scheduler's ``step`` (DeepSpeed's signature)."""
        if self._inside_no_sync:
            raise AssertionError(
                "It is illegal to call Engine.step() inside no_sync context manager"
            )
        self._step_applied = False
        if self.is_gradient_accumulation_boundary():
            with self.reporter.phase("optimizer"):
                self._take_model_step(lr_kwargs or {})
        self.micro_steps += 1

    def _take_model_step(self, lr_kwargs: dict[str, Any]) -> None:
        scale = self.scaler.loss_scale
        # 1. this rank's averaged gradient shards
        grads = self.strategy.reduced_grads()
        # 2. overflow, agreed by every rank
        overflow = self._checks_overflow() and self._overflow(grads)
        self.optimizer.overflow = overflow
        if overflow:
            self._skip(scale)
            return
        # 3. unscale, global norm, clip
        grads32 = [g.float() for g in grads]
        if scale != 1.0:
            for g in grads32:
                g.mul_(1.0 / scale)
        norm = self._grad_norm_sq(grads32).sqrt()
        clip = self._config.gradient_clipping
        if clip > 0:
            coef = torch.clamp(clip / (norm + 1e-6), max=1.0)
            for g in grads32:
                g.mul_(coef)
        # 4. Adam on the fp32 masters, then the parameters
        offloaded_step = getattr(self.strategy, "optimizer_step", None)
        other = self.optimizer.shard_optimizer
        if other is not None:  # a torch optimizer other than Adam(W), on the fp32 shards
            shards = self.strategy.shards
            groups = [self.optimizer.param_groups[s.group] for s in shards]
            other.step([s.master for s in shards], grads32, groups)
        elif offloaded_step is not None:  # offload (engine/offload.py): Adam where O lives
            offloaded_step(grads32, self.optimizer.hyper)
        else:
            for shard, g in zip(self.strategy.shards, grads32):
                adam_step(shard.master, g, shard.state, self.optimizer.hyper(shard.group))
        del grads32
        self.strategy.publish_params()
        memory = self.strategy.memory()
        if other is not None:  # its state is the shard optimizer's, not the Adam moments
            memory.optim = (memory.optim or 0) + other.nbytes
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
            self.lr_scheduler.step(**lr_kwargs)
        self._grad_norm = norm
        self._step_applied = True
        self._finish_step(memory=memory, lr=lr, grad_norm=norm, scale=scale, overflow=False)

    def _overflow(self, grads: list[torch.Tensor]) -> bool:
        """Did any rank's gradients overflow? (engine/parallel also asks the other stages and
        tensor shards.)"""
        flag = local_overflow(grads, device=self.device)
        if self.strategy.sharded:  # at stage 0 every rank checks the same averaged grads
            self.comm.all_reduce(flag, op=dist.ReduceOp.MAX, label="overflow").wait()
        return bool(flag.item())

    def _grad_norm_sq(self, grads32: list[torch.Tensor]) -> torch.Tensor:
        """Squared global L2 norm of the unscaled gradients (engine/parallel adds the other
        stages and tensor shards)."""
        sq = torch.zeros(1, dtype=torch.float32, device=self.device)
        for g in grads32:
            sq += g.pow(2).sum()
        if self.strategy.sharded:
            self.comm.all_reduce(sq, label="grad_norm").wait()
        return sq

    def _checks_overflow(self) -> bool:
        """fp16 always; bf16 at stages 1-2 with ``bf16.check_grad_overflow`` (on by default), as
        DeepSpeed's ZeRO-1/2 optimizer skips a bf16 step whose gradients hold inf/NaN."""
        cfg = self._config
        if cfg.precision == "fp16":
            return True
        return (
            cfg.precision == "bf16"
            and cfg.bf16.check_grad_overflow
            and cfg.zero_optimization.stage in (1, 2)
        )

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
        # DeepSpeed's optimizers report an infinite norm for a step skipped on inf/NaN
        self._grad_norm = torch.tensor(float("inf"))
        self._finish_step(
            memory=memory, lr=self.get_lr()[0], grad_norm=None, scale=scale, overflow=True
        )

    def _finish_step(
        self, *, memory: Any, lr: float, grad_norm: Any, scale: float, overflow: bool
    ) -> None:
        self.global_steps += 1
        self.global_samples += self.train_batch_size()
        # already divided by the accumulation steps, micro-batch by micro-batch
        loss = self._loss_sum
        self._loss_sum = None
        fp16 = self._config.precision == "fp16"
        self.reporter.step_end(
            memory=memory,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            loss_scale=scale if fp16 else None,
            overflow=overflow,
            skipped=overflow,
            # This rank's share of the batch, not the global batch: the viewer adds ranks up.
            samples=self._config.micro_batch * self._config.accumulation_steps,
        )
        every = self._config.steps_per_print
        if self.comm.rank == 0 and every > 0 and self.global_steps % every == 0:
            log.info(
                "step %d loss %s lr %.3g%s",
                self.global_steps,
                "NA" if loss is None else f"{float(loss):.4f}",
                lr,
                f" loss_scale {self.scaler.loss_scale:g}" if fp16 else "",
            )
