"""The model's work in one rank's step (tokens, FLOPs, the device's peak): part of the wire,
re-exported by :mod:`zeroscope.agent.schema`. Its own module because both a StepReport and the
step summary a relay makes of it (agent/schema_summary.py) carry it. Stands alone like the
schema: msgspec and nothing of the project."""

from __future__ import annotations

import msgspec


class Work(msgspec.Struct, omit_defaults=True):
    """The model's work in one rank's step, for tokens/s, TFLOP/s and MFU (agent/work.py).
    None is NA; ``na`` says why tokens or FLOPs are not known."""

    tokens: int | None = None
    """Sequence positions the model's forward took in the step (every micro-batch; padding
    left out where an attention mask was handed in)."""
    positions: int | None = None
    """batch x seq of every micro-batch: what the model computed on, padding included."""
    seq_len: int | None = None
    flops: float | None = None
    """Model FLOPs of the step (forward + backward), counted with torch's FLOP formulas on one
    step of these input shapes."""
    flops_step: int = 0
    """The step the count ran on."""
    flops_fit: bool = False
    """``flops`` is not a count of these shapes: the exact fit of the counted steps over the
    micro-batches' b, b·s and b·s² (agent/flops_fit.py), verified on ``flops_step``."""
    peak_flops: float | None = None
    """The device's peak [FLOP/s] that MFU divides by; ``peak_source`` says which."""
    peak_source: str = ""
    dense_params: int | None = None
    """Parameters that do matmul work (embedding tables left out), and the attention shape,
    for the closed-form prediction 6·N·positions + 12·layers·hidden·seq·positions."""
    layers: int | None = None
    hidden: int | None = None
    na: str = ""
