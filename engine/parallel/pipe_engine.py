"""DeepSpeed's PipelineEngine (runtime/pipe/engine.py) on torch.distributed.pipelining: one
``train_batch()`` runs ``gradient_accumulation_steps`` micro-batches through the stages under the
configured schedule and takes one optimizer step.

One train_batch, on every rank::

    load micro-batches (first stage: inputs, last stage: labels; from data_iter/training_data)
    strategy.hold_reductions(True)        # backward only accumulates, whatever the schedule
    schedule.step(...)                    # F/B(/I/W) of every micro-batch; the last stage's
                                          # loss is scaled by loss_scale / micro-batches
    tied weights: gradients summed over the stages holding them
    strategy.hold_reductions(False); one reducing micro-step over the data-parallel group
    optimizer step (ParallelEngine: norm and overflow agreed over the replica)
    loss: mean over micro-batches, averaged over data parallel, broadcast over the pipeline

Holding the ZeRO reductions until every micro-batch's backward is done is what lets stages 2
and 3 run under pipeline parallelism (DeepSpeed refuses both: its stage-2/3 gradient hooks
reduce on every backward). torch's own PipelineStage defers only for DDP and FSDP2.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from zeroscope.engine.config import ConfigError

from .parallel_engine import ParallelEngine
from .pipe_data import pipeline_loader
from .pipe_module import PipelineError, PipelineModule
from .schedule import build_schedule, check_placement, planned_order, schedule_kind
from .stage_probe import StageProbe


def _to(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple | list):
        return type(x)(_to(t, device) for t in x)
    return x


class PipelineEngine(ParallelEngine):
    """See the module docstring. ``forward``/``backward``/``step`` are not available."""

    def __init__(self, **engine_args: Any) -> None:
        super().__init__(**engine_args)
        module = self.module
        assert isinstance(module, PipelineModule)
        pipe = self._config.pipeline
        if pipe.activation_checkpoint_interval > 0:
            module.activation_checkpoint_interval = pipe.activation_checkpoint_interval
        self.micro_batches = self._config.accumulation_steps
        self.micro_batch_size = self._config.micro_batch
        self.grid = module.mpu()
        self.num_stages = module.num_stages
        self.stage_id = module.stage_id
        self.kind = schedule_kind(pipe.schedule)
        check_placement(self.kind, module)
        if self.kind.zero_bubble and self._config.zero_optimization.stage == 3:
            raise ConfigError(
                f"pipeline.schedule {pipe.schedule!r} computes weight gradients outside autograd's "
                f"accumulation, which ZeRO stage 3's released parameters cannot take; use a "
                f"1F1B/GPipe/interleaved schedule with stage 3"
            )
        if self.kind.multi and self.micro_batches % self.num_stages:
            raise ConfigError(
                f"{self.kind.cls} needs gradient_accumulation_steps ({self.micro_batches}) to be a "
                f"multiple of the pipeline stages ({self.num_stages})"
            )
        self.has_first = 0 in module.stage_indices
        self.has_last = module.total_chunks - 1 in module.stage_indices
        self._schedules: dict[int, tuple[Any, list[Any], StageProbe]] = {}
        self.schedule, self.stages, self.probe = self._schedule_for(self.micro_batches)
        self.data_iterator: Iterator[Any] | None = None
        self.training_dataloader: Any = None
        self.batch_fn: Any = None
        self.agg_train_loss: torch.Tensor | None = None
        self._mb_args: list[tuple[Any, ...]] = []
        self._mb_labels: list[Any] = []
        self._mb_losses: dict[int, torch.Tensor] = {}
        """Loss of each micro-batch of the step (the stage's metadata inference also calls the
        loss function once, on placeholder activations, before micro-batch 0 really runs)."""
        self._loss_factor = 1.0
        self._compute_loss = True
        self._n_current = self.micro_batches
        self._report_layout()

    # -- the schedule ------------------------------------------------------------------------

    def _schedule_for(self, microbatches: int) -> tuple[Any, list[Any], StageProbe]:
        found = self._schedules.get(microbatches)
        if found is None:
            schedule, stages = build_schedule(
                self.kind,
                self.module,
                microbatches=microbatches,
                loss_fn=self._loss,
                device=self.device,
            )
            schedule._split_inputs = self._split_inputs  # our micro-batches, exactly as loaded
            found = (schedule, stages, StageProbe(stages, self.reporter.tel, self.reporter.phase))
            self._schedules[microbatches] = found
        return found

    def _report_layout(self) -> None:
        if getattr(self, "schedule", None) is not None:  # once the schedule exists
            super()._report_layout()

    def _pipeline_layout(self) -> dict[str, Any] | None:
        """The pipeline part of this rank's layout report (schedule, stages, plan)."""
        module = self.module
        return {
            "schedule": self.kind.cls,
            "microbatches": self.micro_batches,
            "stages": list(module.stage_indices),
            "num_stages": module.total_chunks,
            "parts": list(module.parts),
            "plan": planned_order(
                self.schedule, self.stage_id, module.stage_indices, self.micro_batches
            ),
        }

    def _split_inputs(self, args: Any, kwargs: Any = None) -> tuple[list[Any], list[Any]]:
        n = len(self._mb_args) if args else self._n_current
        return (self._mb_args if args else [()] * n), [{}] * n

    def _loss(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        mb = int(index.reshape(-1)[0])
        fn = self.module.loss_fn
        loss = (
            fn(output, self._mb_labels[mb]) if (fn is not None and self._compute_loss) else output
        )
        self._mb_losses[mb] = loss.detach()
        factor = self._loss_factor
        return loss.float() * factor if factor != 1.0 else loss

    # -- data ----------------------------------------------------------------------------------

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def get_pipeline_parallel_rank(self) -> int:
        return self.stage_id

    def set_dataloader(self, loader: Any) -> None:
        if self.has_first or self.has_last:
            self.training_dataloader = loader
            self.data_iterator = iter(loader)

    def set_dataiterator(self, iterator: Any) -> None:
        """Store an iterator to sample for training data (first and last stages read it)."""
        if self.has_first or self.has_last:
            self.training_dataloader = None
            self.data_iterator = iterator

    def set_batch_fn(self, fn: Any) -> None:
        self.batch_fn = fn

    def set_training_data(self, dataset: Any, collate_fn: Any = None) -> None:
        """DeepSpeed's ``_build_data_iter``: a repeating, in-order loader over this replica's
        share of ``dataset``."""
        self.set_dataloader(
            pipeline_loader(
                dataset,
                micro_batch=self.micro_batch_size,
                dp_size=self.parallel.coords.dp_size,
                dp_rank=self.parallel.coords.dp,
                collate_fn=collate_fn,
            )
        )

    def _load(self, microbatches: int) -> None:
        self._mb_args, self._mb_labels = [], []
        self._n_current = microbatches
        if not (self.has_first or self.has_last):
            return
        with self.reporter.phase("data"):
            for _ in range(microbatches):
                batch = next(self.data_iterator) if self.data_iterator is not None else None
                if self.batch_fn is not None:
                    batch = self.batch_fn(batch)
                if batch is None:
                    raise PipelineError("no training data: pass data_iter or training_data")
                if self.has_first:
                    inputs = _to(batch[0], self.device)
                    self._mb_args.append(
                        tuple(inputs) if isinstance(inputs, tuple | list) else (inputs,)
                    )
                if self.has_last:
                    self._mb_labels.append(_to(batch[1], self.device))

    def _run(self, schedule: Any, microbatches: int, *, train: bool) -> Any:
        args = (torch.zeros(1),) if self.has_first else ()
        target = torch.arange(microbatches) if self.has_last else None
        self._mb_losses = {}
        run = schedule.step if train else schedule.eval
        return run(*args, target=target)

    # -- training ------------------------------------------------------------------------------

    def train_batch(self, data_iter: Iterator[Any] | None = None) -> torch.Tensor:
        """Train on the next ``gradient_accumulation_steps`` micro-batches; returns the mean
        loss over them, averaged over the data-parallel replicas (on every stage)."""
        if not torch.is_grad_enabled():
            raise RuntimeError(
                "train_batch() requires gradients enabled. Use eval_batch() instead."
            )
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        self.module.train()
        m = self.micro_batches
        self._load(m)
        schedule, _, probe = self._schedule_for(m)
        self._loss_factor = self.scaler.loss_scale / m
        self.strategy.hold_reductions(True)
        try:
            with probe.step() as times:
                self._run(schedule, m, train=True)
            # before the release: stage 3 takes the held gradients out of param.grad
            self.module.allreduce_tied_weight_gradients()
        finally:
            self.strategy.hold_reductions(False)
        with self.reporter.phase("backward"):
            self.strategy.begin_micro_step(boundary=True)
            self.strategy.end_micro_step()
        local, agg = self._aggregate_loss(m)
        self._loss_sum = local
        self.reporter.pipeline_step(times)
        self._step_applied = False
        with self.reporter.phase("optimizer"):
            self._take_model_step({})
        self.micro_steps += m
        self.agg_train_loss = agg
        return agg

    def _aggregate_loss(self, microbatches: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(this replica's mean loss, that mean averaged over data parallel), broadcast from the
        last stage to the others of the pipeline (DeepSpeed's ``_aggregate_total_loss``)."""
        losses = torch.zeros(2, dtype=torch.float32, device=self.device)
        if self.has_last:
            local = torch.stack(
                [self._mb_losses[i].float().reshape(()) for i in range(microbatches)]
            )
            local = local.sum()
            local = local / microbatches
            agg = local.clone()
            self.comm.all_reduce(agg, label="loss").wait()
            losses = torch.stack([local, agg / self.comm.world_size])
        group = self.module.mesh.group("pp")
        if group is not None and self.num_stages > 1:
            src = self.grid.stage_to_global(self.module.chunk_owner(self.module.total_chunks - 1))
            dist.broadcast(losses, src=src, group=group)
        return losses[0], losses[1]

    def eval_batch(
        self,
        data_iter: Iterator[Any],
        return_logits: bool = False,
        compute_loss: bool = True,
        reduce_output: str | None = "avg",
        bcast_loss: bool = True,
        num_micro_batches: int | None = None,
    ) -> Any:
        """Forward only over the next micro-batches of ``data_iter``; the mean loss (over
        micro-batches and data parallel, broadcast over the pipeline when ``bcast_loss``)."""
        if reduce_output not in ("avg", None):
            raise NotImplementedError(f"reduction type {reduce_output} not supported.")
        self.module.eval()
        m = num_micro_batches or self.micro_batches
        train_iterator, self.data_iterator = self.data_iterator, data_iter
        self._compute_loss = compute_loss
        try:
            self._load(m)
            schedule, _, _ = self._schedule_for(m)
            self._loss_factor = 1.0
            with torch.no_grad():
                outputs = self._run(schedule, m, train=False)
        finally:
            self.data_iterator = train_iterator
            self._compute_loss = True
            self.module.train()
        if reduce_output is None:
            result: Any = [self._mb_losses[i] for i in range(m)]
        else:
            _, agg = self._aggregate_loss(m)
            result = agg if bcast_loss or self.has_last else None
        return (result, outputs) if return_logits else result

    # -- not in pipeline mode ------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise PipelineError("Only train_batch() is accessible in pipeline mode.")

    def backward(self, *args: Any, **kwargs: Any) -> Any:
        raise PipelineError("Only train_batch() is accessible in pipeline mode.")

    def step(self, *args: Any, **kwargs: Any) -> Any:
        raise PipelineError("Only train_batch() is accessible in pipeline mode.")

    def is_gradient_accumulation_boundary(self) -> bool:
        return True

    def reset_activation_shape(self) -> None:
        """DeepSpeed API: shapes are inferred by the stages on every schedule (no-op)."""
