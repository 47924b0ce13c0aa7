"""``deepspeed.runtime.lr_schedules``: DeepSpeed's schedule names and classes (the engine's own
formulas, engine/lr_schedules.py). ``LRRangeTest`` and ``OneCycle`` are named (accelerate
recognizes schedules by this list) but not built: a ds_config naming them is refused."""

from __future__ import annotations

from zeroscope.engine.lr_schedules import WarmupCosineLR, WarmupDecayLR, WarmupLR

LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]

__all__ = ["VALID_LR_SCHEDULES", "WarmupCosineLR", "WarmupDecayLR", "WarmupLR"]
