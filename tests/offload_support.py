"""Shared helpers of the offload and checkpoint tests: a ds_config builder, a recorder that also
keeps transfers, and one training loop over tests/models.py's TinyGPT through ``initialize``."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.models import TinyGPT, batches
from tests.recorder import RecordingTelemetry

LR, BETAS, EPS, WD = 1e-2, (0.9, 0.99), 1e-5, 0.01


class TransferRecorder(RecordingTelemetry):
    """RecordingTelemetry plus, per step, the transfers reported in it."""

    def __init__(self) -> None:
        super().__init__()
        self.transfers: list[list[tuple[str, int, int, int]]] = []
        self._pending_transfers: list[tuple[str, int, int, int]] = []

    def transfer(
        self, direction: Any, nbytes: int, start_ns: int, end_ns: int, label: str = ""
    ) -> None:
        self._pending_transfers.append((direction, nbytes, start_ns, end_ns))

    def step_end(self, *, memory: Any, **figures: Any) -> None:
        super().step_end(memory=memory, **figures)
        self.transfers.append(self._pending_transfers)
        self._pending_transfers = []

    def bytes_in_step(self, step: int, direction: str) -> int:
        return sum(n for d, n, _, _ in self.transfers[step] if d == direction)


def ds_config(stage: int, precision: str = "fp32", **zero: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 0,
        "zero_optimization": {"stage": stage, **zero},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD},
        },
    }
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


@dataclass
class Run:
    engine: Any
    recorder: TransferRecorder
    losses: list[float] = field(default_factory=list)


def build(config: dict[str, Any], *, seed: int = 0, model_kw: dict | None = None) -> Run:
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize

    recorder = TransferRecorder()
    set_telemetry(recorder)
    torch.manual_seed(seed)
    model = TinyGPT(**(model_kw or {}))
    engine, *_ = initialize(model=model, config=config)
    return Run(engine=engine, recorder=recorder)


def train(run: Run, rank: int, world: int, steps: range, *, seed: int = 0) -> list[float]:
    """Train the given global steps (the data of step k is the same whatever run trains it:
    resuming at step k continues with step k's batch). Returns the losses."""
    data = batches(max(steps.stop, 1), 2 * world, seed=seed)
    for k in steps:
        x, y = data[k]
        loss = run.engine(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2])
        run.engine.backward(loss)
        run.engine.step()
        run.losses.append(float(loss.detach()))
    return run.losses


def padded_shard_elements(model: torch.nn.Module, stage: int, world: int) -> int:
    """Psi / N after padding, from the plain model: one flat buffer padded to a multiple of N
    at stages 1-2 (one bucket), every parameter padded on its own at stage 3."""
    numels = [p.numel() for p in model.parameters()]
    if stage == 3:
        return sum(math.ceil(n / world) for n in numels)
    return math.ceil(sum(numels) / world)
