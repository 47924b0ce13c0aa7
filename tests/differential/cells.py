"""The cells of the differential matrix: one model, one ds_config, one training script, run on
both engines (tests/differential/runner.py) and compared (tests/differential/compare.py).

Every cell's ds_config is the same dict for both engines. ``torch_adam`` is set where there is
no offload because DeepSpeed's FusedAdam is a CUDA op (with it DeepSpeed steps with
``torch.optim.AdamW``); with CPU offload DeepSpeed steps with its own DeepSpeedCPUAdam (a
JIT-built C++ op), the path real offload users run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

LR, BETAS, EPS, WD = 2e-2, (0.9, 0.99), 1e-6, 0.01

OTHER_OPTIMIZERS: dict[str, dict[str, Any]] = {
    "SGD": {"lr": 0.05, "momentum": 0.9, "weight_decay": WD},
    "Adagrad": {"lr": 0.05, "weight_decay": WD},
}
"""Hyperparameters of the non-Adam optimizers, ds_config or client alike."""


def client_optimizer(name: str, params: Any) -> Any:
    """The torch optimizer a ``client-<type>`` cell passes to ``initialize``."""
    import torch

    kind = name.removeprefix("client-")
    if kind == "AdamW":
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    return getattr(torch.optim, kind)(params, **OTHER_OPTIMIZERS[kind])


SCHEDULERS: dict[str, dict[str, Any]] = {
    # No warmup_max_lr: DeepSpeed 0.19 then warms up to the optimizer's lr; log warm-up.
    "warmup": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
    "decay": {
        "type": "WarmupDecayLR",
        "params": {
            "warmup_num_steps": 2,
            "total_num_steps": 6,
            "warmup_max_lr": LR,
            "warmup_type": "linear",
        },
    },
    "cosine": {
        "type": "WarmupCosineLR",
        "params": {"warmup_num_steps": 2, "total_num_steps": 6, "warmup_min_ratio": 0.1},
    },
}


@dataclass(frozen=True, kw_only=True)
class Cell:
    model: str
    stage: int
    precision: str = "fp32"
    offload: str = "none"
    """none | cpu | nvme: offload_optimizer, and offload_param too at stage 3."""
    persistence: int | None = None
    """stage3_param_persistence_threshold (None: DeepSpeed's default, 1e5)."""
    accumulation: int = 3
    clip: float | None = 0.6
    """gradient_clipping; None leaves the key out (DeepSpeed then clips at 1.0)."""
    scheduler: str | None = "warmup"
    steps: int = 4
    """Optimizer steps."""
    resume_at: int | None = None
    """Save after this many optimizer steps, rebuild from another seed, load, continue."""
    optimizer: str = "AdamW"
    """A ds_config optimizer type (AdamW, SGD, Adagrad), or ``client-SGD`` /
    ``client-Adagrad`` / ``client-AdamW``: a torch optimizer given to ``initialize`` (with
    ``zero_allow_untested_optimizer``), as the pipeline tutorial does."""
    tags: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        parts = [self.model, f"s{self.stage}", self.precision]
        if self.offload != "none":
            parts.append(f"off-{self.offload}")
        if self.stage == 3:
            parts.append(f"p{'def' if self.persistence is None else self.persistence}")
        parts.append(f"ga{self.accumulation}")
        parts.append("clip-absent" if self.clip is None else f"clip{self.clip:g}")
        parts.append(self.scheduler or "const")
        if self.resume_at is not None:
            parts.append(f"resume@{self.resume_at}")
        if self.optimizer != "AdamW":
            parts.append(self.optimizer)
        return "/".join(parts)

    def ds_config(self, nvme_path: str) -> dict[str, Any]:
        zero: dict[str, Any] = {"stage": self.stage}
        if self.stage == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = True
            if self.persistence is not None:
                zero["stage3_param_persistence_threshold"] = self.persistence
        if self.offload != "none":
            where: dict[str, Any] = {"device": self.offload}
            if self.offload == "nvme":
                where["nvme_path"] = nvme_path
            zero["offload_optimizer"] = dict(where)
            if self.stage == 3:
                zero["offload_param"] = dict(where)
        params: dict[str, Any] = {"lr": LR, "betas": list(BETAS), "eps": EPS, "weight_decay": WD}
        if self.offload == "none":
            params["torch_adam"] = True
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": self.accumulation,
            "steps_per_print": 10**9,
            "zero_optimization": zero,
        }
        if self.optimizer != "AdamW":  # DeepSpeed's ZeRO refuses other optimizers without it
            cfg["zero_allow_untested_optimizer"] = True
        if self.optimizer.startswith("client-"):
            pass
        elif self.optimizer == "AdamW":
            cfg["optimizer"] = {"type": "AdamW", "params": params}
        else:
            cfg["optimizer"] = {"type": self.optimizer, "params": OTHER_OPTIMIZERS[self.optimizer]}
        if self.clip is not None:
            cfg["gradient_clipping"] = self.clip
        if self.scheduler is not None:
            cfg["scheduler"] = SCHEDULERS[self.scheduler]
        if self.precision == "bf16":
            cfg["bf16"] = {"enabled": True}
        return cfg


def matrix() -> list[Cell]:
    """Stages 0-3 x fp32/bf16 x offload none/cpu on the hand-made model; the transformers
    models at each stage with persistence 0 and default; the schedulers, accumulation 1, an
    absent clip; resume at every stage."""
    cells: list[Cell] = []
    for precision in ("fp32", "bf16"):
        cells.append(Cell(model="odd", stage=0, precision=precision))
        for stage in (1, 2, 3):
            for offload in ("none", "cpu"):
                cells.append(
                    Cell(
                        model="odd",
                        stage=stage,
                        precision=precision,
                        offload=offload,
                        persistence=50 if stage == 3 else None,
                    )
                )
    for model in ("llama", "gpt2"):
        cells += [
            Cell(model=model, stage=0, accumulation=1, scheduler="cosine"),
            Cell(model=model, stage=1, precision="bf16", scheduler="decay"),
            Cell(model=model, stage=2, offload="cpu", accumulation=2),
            Cell(model=model, stage=2, precision="bf16", clip=None),
            Cell(model=model, stage=3, persistence=0),
            Cell(model=model, stage=3, precision="bf16", persistence=0, scheduler="cosine"),
            Cell(model=model, stage=3, offload="cpu"),
        ]
    # DeepSpeed clips at 1.0 when gradient_clipping is absent; this model's norms are > 1.
    cells.append(Cell(model="odd", stage=1, clip=None, scheduler="cosine"))
    for stage in (0, 1, 2, 3):
        cells.append(
            Cell(
                model="odd",
                stage=stage,
                persistence=0 if stage == 3 else None,
                scheduler="decay",
                resume_at=2,
            )
        )
    cells.append(Cell(model="llama", stage=3, precision="bf16", persistence=0, resume_at=2))
    cells.append(Cell(model="gpt2", stage=2, offload="cpu", resume_at=2))
    return cells


def nvme_twins() -> list[tuple[Cell, Cell]]:
    """(NVMe cell, the same cell with CPU offload) for every CPU-offload cell of the matrix.
    DeepSpeed's NVMe path needs libaio; where it cannot run, NVMe is compared against the
    engine's own CPU-offload run (the same numbers, stored elsewhere)."""
    chosen = [
        c
        for c in matrix()
        if c.offload == "cpu"
        and (
            c.stage == 3 or c.resume_at is not None or (c.model == "odd" and c.precision == "bf16")
        )
    ]
    return [(replace(c, offload="nvme"), c) for c in chosen]
