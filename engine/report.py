"""Everything the engine tells the agent, in one place (collectives are reported in process_group.py,
where they are issued). The engine calls these few methods; nothing else in engine/ touches
:mod:`zeroscope.agent.api`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from zeroscope.agent.api import PhaseName, Telemetry
from zeroscope.agent.loss_scale import scale_text
from zeroscope.agent.schema import (
    ConfigSummary,
    MemoryBytes,
    ParallelLayout,
    ParamCounts,
    PipelineStep,
    StageAction,
)

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
        hysteresis=cfg.fp16.hysteresis,
        initial_scale_power=cfg.fp16.initial_scale_power,
        offload_pin_memory=zero.offload_optimizer.pin_memory,
        gather_16bit_weights_on_model_save=zero.stage3_gather_16bit_weights_on_model_save,
        contiguous_gradients=zero.contiguous_gradients,
    )


def largest_layer(module: torch.nn.Module) -> int:
    """Elements of the module that directly owns the most parameter elements (a parameter
    partitioned by ``zero.Init`` counts with its full ``ds_numel``)."""
    return max(
        (sum(param_numel(p) for p in m.parameters(recurse=False)) for m in module.modules()),
        default=0,
    )


def repeated_blocks(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the longest ModuleList / Sequential of two or more modules
    of one class that hold parameters (transformer layers, ResNet stages); [] when none."""
    best: list[torch.nn.Module] = []
    for m in module.modules():
        if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential):
            kids = list(m.children())
            if (
                len(kids) > max(1, len(best))
                and len({type(k) for k in kids}) == 1
                and any(True for k in kids for _ in k.parameters())
            ):
                best = kids
    return best


def model_bytes(module: torch.nn.Module) -> tuple[int, bool]:
    """(bytes of the parameters as the engine receives them, whether they came partitioned by
    ``zero.Init``: such parameters carry ``ds_tensor`` and an empty placeholder)."""
    params = list(module.parameters())
    return sum(p.numel() * p.element_size() for p in params), any(
        hasattr(p, "ds_tensor") for p in params
    )


def param_numel(param: torch.Tensor) -> int:
    """Elements of ``param``, also while it is a ZeRO-3 placeholder."""
    return int(getattr(param, "ds_numel", param.numel()))


class Reporter:
    """The engine's side of the agent seam."""

    def __init__(self, tel: Telemetry) -> None:
        self.tel = tel
        self._blocks: list[torch.nn.Module] = []

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
        layers: int = 0,
        built: tuple[int, bool] = (0, False),
    ) -> None:
        self.tel.hello(
            config=config_summary(cfg, dp_world_size, optimizer),
            params=ParamCounts(
                total=total,
                trainable=psi,
                persistent=persistent,
                padded_total=padded,
                largest_layer=largest,
                layers=layers,
                built_bytes=built[0],
                zero_init=built[1],
            ),
            device=str(device),
        )

    def watch_blocks(self, module: torch.nn.Module) -> int:
        """Remember each repeated block of ``module`` for the agent (it splits activation bytes
        by block: what activation checkpointing would keep and drop); returns the block count.
        Their marks are hooked only for the forwards the agent counts (``phase``): a module
        hook costs every call of its module, and most steps are not counted."""
        self._blocks = repeated_blocks(module)
        return len(self._blocks)

    def compiled(self) -> None:
        """The module was compiled (``engine.compile()``): no more block marks (a hook
        registered on a block inside the compiled graph would recompile it and run the agent
        inside it); the per-block activation split is NA from now on, said once."""
        if self._blocks:
            self._blocks = []
            self.tel.event(
                "info",
                "per-block activation split: NA for a compiled module (its block hooks "
                "would run inside the compiled graph); total activations are still counted",
            )

    @contextlib.contextmanager
    def phase(self, name: PhaseName) -> Iterator[None]:
        with self.tel.phase(name):
            if name != "forward" or not self._blocks or not self.tel.blocks_wanted():
                yield
                return
            handles = self._mark_blocks()
            try:
                yield
            finally:
                for handle in handles:
                    handle.remove()

    def _mark_blocks(self) -> list[Any]:
        """Hook each block's forward to announce it to the agent (for one forward)."""
        tel = self.tel

        def enter(_: torch.nn.Module, args: tuple[Any, ...]) -> None:
            x = args[0] if args else None
            tel.block_enter(x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0)

        def leave(_: torch.nn.Module, args: tuple[Any, ...], out: Any) -> None:
            tel.block_exit()

        handles = []
        for block in self._blocks:
            handles.append(block.register_forward_pre_hook(enter))
            handles.append(block.register_forward_hook(leave))
        return handles

    def model_inputs(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: Any) -> None:
        """A micro-batch entering the model: the agent takes its tokens (and counts model
        FLOPs on one step) from it."""
        self.tel.model_inputs(module, args, kwargs)

    def overflow(self, scale: float) -> None:
        self.tel.event(
            "overflow",
            f"fp16 gradient overflow at loss scale {scale_text(scale)}: step skipped",
            value=scale,
        )

    def scale_change(self, old: float, new: float) -> None:
        if new != old:
            change = f"{scale_text(old)} -> {scale_text(new)}"
            self.tel.event("scale_change", f"loss scale {change}", value=new)

    def scale_at_minimum(self, scale: float) -> None:
        self.tel.event(
            "scale_at_minimum",
            f"overflow with the loss scale at its minimum {scale_text(scale)}",
            value=scale,
        )

    def step_end(self, *, memory: MemoryBytes, **figures: Any) -> None:
        self.tel.step_end(memory=memory, **figures)

    # -- 3D parallelism (engine/parallel) -----------------------------------------------------

    def layout(self, coords: Any, pipeline: dict[str, Any] | None = None) -> None:
        """This rank's mesh coordinates (a ``MeshCoords``) and pipeline schedule, once."""
        self.tel.layout(
            ParallelLayout(
                dp=coords.dp,
                pp=coords.pp,
                tp=coords.tp,
                dp_size=coords.dp_size,
                pp_size=coords.pp_size,
                tp_size=coords.tp_size,
                **(pipeline or {}),
            )
        )

    def pipeline_step(self, times: Any) -> None:
        """One schedule step's timed actions (a ``stage_probe.StepTimes``)."""
        t0 = times.start_ns
        self.tel.pipeline(
            PipelineStep(
                step_s=times.step_s,
                p2p_wait_s=times.p2p_wait_ns / 1e9,
                actions=[
                    StageAction(
                        kind=a.kind,
                        stage=a.stage,
                        microbatch=a.microbatch,
                        start_s=(a.start_ns - t0) / 1e9,
                        duration_s=(a.end_ns - a.start_ns) / 1e9,
                    )
                    for a in times.actions
                ],
            )
        )
