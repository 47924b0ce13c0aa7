"""A ds_config written for the Hugging Face integration (the Trainer, accelerate), whose batch keys
are ``"auto"``: what it becomes once the Trainer fills them, for preflight to check
(``zeroscope advise ds_config.json --world-size N --per-device-train-batch-size B
--gradient-accumulation-steps K``).

As transformers' ``HfTrainerDeepSpeedConfig.trainer_config_process`` does: an ``"auto"``
``train_micro_batch_size_per_gpu`` takes ``per_device_train_batch_size``, an ``"auto"``
``gradient_accumulation_steps`` takes the Trainer's, and an ``"auto"`` ``train_batch_size`` takes
world size x both; a number that disagrees with the Trainer's is a mismatch the Trainer refuses
to start with (``trainer_config_finalize``). Without the Trainer's values ``"auto"`` is left, and
said: plain ``deepspeed.initialize`` cannot resolve it, and the Trainer resolves it from
arguments preflight does not have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .model import Advice, Change


def fill_auto(
    raw: Mapping[str, Any], world_size: int, per_device: int, accumulation: int
) -> tuple[dict[str, Any], list[Advice]]:
    """``raw`` with its batch keys as the Trainer fills them, and the mismatches it refuses."""
    trainer = {  # ds_config key -> (the Trainer's value, its name, how it is made)
        "train_batch_size": (
            world_size * per_device * accumulation,
            "train_batch_size",
            " (world size x per_device_train_batch_size x gradient_accumulation_steps)",
        ),
        "train_micro_batch_size_per_gpu": (per_device, "per_device_train_batch_size", ""),
        "gradient_accumulation_steps": (accumulation, "gradient_accumulation_steps", ""),
    }
    filled = dict(raw)
    out = []
    for key, (value, name, how) in trainer.items():
        if raw.get(key) == "auto":
            filled[key] = value
        elif key in raw and raw[key] != value:
            out.append(
                Advice(
                    rule="auto",
                    title=f"{key} disagrees with the Trainer's {name}",
                    evidence=(f"ds_config {key} {raw[key]!r}, the Trainer's {name}{how} {value}",),
                    change=Change({key: "auto"}),
                    formula="the Trainer refuses a ds_config value that mismatches its own "
                    "(transformers' HfTrainerDeepSpeedConfig.trainer_config_finalize)",
                    confidence="high",
                    severity="error",
                )
            )
    return filled, out


def auto_left(autos: list[str]) -> Advice:
    """``"auto"`` batch keys and no Trainer values to fill them: said, not an error (the
    Trainer and accelerate fill them; only plain ``deepspeed.initialize`` fails on them)."""
    return Advice(
        rule="auto",
        title='"auto" batch keys: only the Hugging Face integration fills them',
        evidence=(f'{", ".join(autos)} = "auto" in the ds_config',),
        change=Change(
            code="for the Trainer or accelerate, give --per-device-train-batch-size and "
            "--gradient-accumulation-steps to check the batch it makes; for "
            "deepspeed.initialize, numbers"
        ),
        formula='DeepSpeed itself cannot resolve "auto" (a TypeError at start-up); the '
        "Trainer fills it from its arguments",
        confidence="high",
    )
