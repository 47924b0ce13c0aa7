"""How far fp32 arithmetic itself lands from exact on a generated model's cell: the independent
answer for a seed whose engines differ by more than the suite's tolerance.

Some generated models are ill-conditioned (a LayerNorm over 2 features: its gradient grows as
the two inputs meet), so any change of summation order, such as two ranks' gradients reduced
in another order, moves a figure by more than 1e-5. For such a seed the one-process reference
is trained twice, in float32 and float64 from the same initial weights and data, and compared
as the engines are compared (tests/differential/compare.py's definitions): where each engine
is within three times float32's own distance from float64 of the float64 result, their difference
is fp32 rounding the model amplifies, not a difference between the engines.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from .cells import BETAS, EPS, LR, OTHER_OPTIMIZERS, WD, Cell
from .compare import seq_rel
from .models import build_model, loss_of, micro_batches

WORLD = 2
"""The ranks the suite's cells train on (their micro-batches are the reference's)."""

AMPLIFIED = 3.0
"""An engine up to this multiple of float32's own error from float64 counts as rounding. The
one-process float32 run adds its gradients in one order, the engines in another across two
ranks: on seed 196 the engine sat at 1.9x, so 2x left a 5 % margin that another CPU's
vectorised sums could cross; a real engine difference is orders of magnitude past 3x."""


def _optimizer(cell: Cell, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    kind = cell.optimizer.removeprefix("client-")
    if kind == "AdamW":  # DeepSpeed's AdamW with torch_adam, as the engine: torch's AdamW
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    optimizer: torch.optim.Optimizer = getattr(torch.optim, kind)(params, **OTHER_OPTIMIZERS[kind])
    return optimizer


@functools.lru_cache(maxsize=8)  # the check and the error both need it
def reference(cell: Cell, dtype: torch.dtype) -> dict[str, Any]:
    """One process trains ``cell``'s model on every rank's micro-batches (each micro-batch's
    loss divided by ranks x accumulation, clipped at ``cell.clip``) in ``dtype`` from the same
    float32 initial weights: rank 0's losses, the pre-clipping norms, the final weights."""
    assert cell.scheduler is None and cell.precision == "fp32" and cell.offload == "none"
    model = build_model(cell.model, None, 0).to(dtype)  # type: ignore[arg-type]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = _optimizer(cell, params)
    ga = cell.accumulation
    data = [micro_batches(cell.steps * ga, r, WORLD) for r in range(WORLD)]
    losses: list[float] = []
    norms: list[float] = []
    for step in range(cell.steps):
        opt.zero_grad()
        for k in range(step * ga, (step + 1) * ga):
            for r in range(WORLD):
                loss = loss_of(model, data[r][k])
                (loss / (WORLD * ga)).backward()
                if r == 0:
                    losses.append(float(loss.detach()))
        for p in params:  # ZeRO's flat gradients hold zeros for an unused parameter, which
            if p.grad is None:  # the optimizer then steps (weight decay), as torch would not
                p.grad = torch.zeros_like(p)
        clip = cell.clip if cell.clip is not None else 1.0
        norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
        opt.step()
    weights = {
        k: v.detach().to(torch.float64).numpy().copy()
        for k, v in model.state_dict().items()
        if v.is_floating_point()
    }
    return {"losses": losses, "grad_norms": norms, "weights": weights}


def _tensors_rel(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for key, exact in b.items():
        scale = float(np.abs(exact).max()) if exact.size else 0.0
        diff = float(np.abs(a[key] - exact).max()) if exact.size else 0.0
        worst = max(worst, diff / scale if scale else diff)
    return worst


def fp32_error(cell: Cell) -> dict[str, float]:
    """float32's own distance from float64 on ``cell``, per compared figure (the 16-bit file
    and zero_to_fp32 hold the same final weights)."""
    low, exact = reference(cell, torch.float32), reference(cell, torch.float64)
    return _distances(low, exact)


def _distances(got: dict[str, Any], exact: dict[str, Any]) -> dict[str, float]:
    """``got`` against the float64 reference, as the engines are compared; an engine's
    weights on the names both hold (its own may add aliases), a grad norm only where it kept
    one (DeepSpeed keeps none at stage 0 in fp32)."""
    keys = got["weights"].keys() & exact["weights"].keys()
    weights = _tensors_rel(
        {k: got["weights"][k] for k in keys}, {k: exact["weights"][k] for k in keys}
    )
    out = {"loss": seq_rel(got["losses"], exact["losses"]), "lr": 0.0}
    out.update(weights=weights, fp32=weights, model16=weights)
    if all(n is not None for n in got["grad_norms"]):
        out["grad_norm"] = seq_rel(got["grad_norms"], exact["grad_norms"])
    return out


def explained_by_rounding(
    figures: dict[str, float], tolerance: float, cell: Cell, engines: list[dict[str, Any]]
) -> bool:
    """Every figure over ``tolerance`` (the engines' difference) is one where each engine
    (``engines``: each one's rank-0 result) is within :data:`AMPLIFIED` times float32's own
    error from float64: both are as close to exact as float32 arithmetic gets on this model,
    so their difference says nothing about either."""
    low, exact = reference(cell, torch.float32), reference(cell, torch.float64)
    error = _distances(low, exact)
    sides = [_distances(e, exact) for e in engines]
    over = [k for k, v in figures.items() if v > tolerance]
    return bool(over) and all(
        k in error and all(side.get(k, 0.0) <= AMPLIFIED * error[k] for side in sides) for k in over
    )
