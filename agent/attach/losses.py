"""A step's micro-batch losses, as the attach holds them until the step's end.

The training thread only keeps each loss tensor (detached: no read, so no device sync); the
step's end makes the one figure the step shows from them (:func:`mean_loss`), and a loop whose
step end never comes has its CPU losses read into floats every :data:`LOSSES_HELD` (so the held
tensors do not pin the allocator's heap).
"""

from __future__ import annotations

from typing import Any

import torch

LOSSES_HELD = 64
"""Micro-batch losses a step holds as tensors before the CPU ones are read into floats. Each
held tensor pins its small block in the allocator's heap between the step's large freed
buffers: a loop whose step end is never seen (no hooked optimizer) grew ~0.4 MB of RSS an
iteration on a DDP MLP (8 x 512, batch 32) until the step's end would have freed them."""


def readable_scalar(t: torch.Tensor) -> torch.Tensor | None:
    """A scalar tensor the agent may keep and read later: detached, a replicated DTensor's
    local value (every rank's is the same: tensor parallel's ``loss_parallel`` loss, FSDP2's
    gradient norm); None for a partial DTensor, whose reading would be a collective of the
    agent's."""
    placements = getattr(t, "placements", None)
    if placements is not None:
        if not all(p.is_replicate() for p in placements):
            return None
        t = t.to_local()  # type: ignore[attr-defined]
    return t.detach()


def read_host_losses(losses: list[tuple[Any, float]]) -> None:
    """Read the held CPU losses now (a float each: no device sync); device ones stay tensors."""
    for i, (loss, weight) in enumerate(losses):
        if isinstance(loss, torch.Tensor) and loss.device.type == "cpu":
            losses[i] = (float(loss), weight)


def mean_loss(losses: list[tuple[Any, float]]) -> Any:
    """The step's loss: the one micro-batch loss, or the mean of several (device tensors are
    averaged on the device, read later without a sync)."""
    if not losses:
        return None
    if len(losses) == 1 and losses[0][1] == 1.0:
        return losses[0][0]
    values = [x for x, _ in losses]
    if not any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in values):
        return sum(float(x) * w for x, w in losses) / len(losses)
    stacked = torch.stack([torch.as_tensor(x).float().reshape(()) * w for x, w in losses])
    return stacked.mean()
