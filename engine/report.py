"""Everything the engine tells the agent, in one place (collectives are reported in process_group.py,
where they are issued). The engine calls these few methods; nothing else in engine/ touches
:mod:`zeroscope.agent.api`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from zeroscope.agent.api import PhaseName, Telemetry
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts

from .config import DeepSpeedConfig


def config_summary(cfg: DeepSpeedConfig, dp_world_size: int, optimizer: str) -> ConfigSummary:
    """The resolved config, as viewers need it to predict memory and traffic."""
    zero = cfg.zero_optimization
    return ConfigSummary(
        stage=zero.stage,
        precision=cfg.precision,
        dp_world_size=dp_world_size,
        offload_optimizer=zero.offload_optimizer.device,
        offload_param=zero.offload_param.device,
        overlap_comm=zero.overlap,
        micro_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=cfg.accumulation_steps,
        train_batch_size=cfg.train_batch_size or 0,
        gradient_clipping=cfg.gradient_clipping,
        reduce_bucket_size=zero.reduce_bucket_size,
        allgather_bucket_size=zero.allgather_bucket_size,
        prefetch_bucket_size=zero.stage3_prefetch_bucket_size,
        param_persistence_threshold=zero.stage3_param_persistence_threshold,
        max_live_parameters=zero.stage3_max_live_parameters,
        max_reuse_distance=zero.stage3_max_reuse_distance,
        optimizer=optimizer,
        loss_scale_window=cfg.fp16.loss_scale_window,
        min_loss_scale=cfg.fp16.min_loss_scale,
    )


def largest_layer(module: torch.nn.Module) -> int:
    """Elements of the module that directly owns the most parameter elements (a parameter
    partitioned by ``zero.Init`` counts with its full ``ds_numel``)."""
    return max(
        (sum(param_numel(p) for p in m.parameters(recurse=False)) for m in module.modules()),
        default=0,
    )


def param_numel(param: torch.Tensor) -> int:
    """Elements of ``param``, also while it is a ZeRO-3 placeholder."""
    return int(getattr(param, "ds_numel", param.numel()))


class Reporter:
    """The engine's side of the agent seam."""

    def __init__(self, tel: Telemetry) -> None:
        self.tel = tel

    def hello(
        self,
        *,
        cfg: DeepSpeedConfig,
        dp_world_size: int,
        optimizer: str,
        total: int,
        psi: int,
        padded: int,
        largest: int,
        device: torch.device,
        persistent: int = 0,
    ) -> None:
        self.tel.hello(
            config=config_summary(cfg, dp_world_size, optimizer),
            params=ParamCounts(
                total=total,
                trainable=psi,
                persistent=persistent,
                padded_total=padded,
                largest_layer=largest,
            ),
            device=str(device),
        )

    @contextlib.contextmanager
    def phase(self, name: PhaseName) -> Iterator[None]:
        with self.tel.phase(name):
            yield

    def overflow(self, scale: float) -> None:
        self.tel.event(
            "overflow", f"fp16 gradient overflow at loss scale {scale:g}: step skipped", value=scale
        )

    def scale_change(self, old: float, new: float) -> None:
        if new != old:
            self.tel.event("scale_change", f"loss scale {old:g} -> {new:g}", value=new)

    def scale_at_minimum(self, scale: float) -> None:
        self.tel.event(
            "scale_at_minimum",
            f"overflow with the loss scale at its minimum {scale:g}",
            value=scale,
        )

    def step_end(self, *, memory: MemoryBytes, **figures: Any) -> None:
        self.tel.step_end(memory=memory, **figures)
