"""Device hygiene of the engine, checked on the CPU.

**The canary.** Every engine buffer must name its device: the engine's device for device
buffers, ``"cpu"`` for host buffers. An allocation left to torch's default device is a bug that
shows only on CUDA (the buffer lands on the CPU beside CUDA tensors: "No backend type associated
with device type cpu" at the first gather, or mixed devices in forward). Here the default device
is set to ``meta`` while the engine is built and trained on the CPU: a buffer that forgot its
device becomes a meta tensor, and the first copy out of it, op beside a CPU tensor, or gloo
collective on it fails. Before the fix every stage-3 config and every offload config failed this
way (stages 0-2 without offload passed); the test trains every stage x offload (none, cpu, nvme)
x precision (fp32, bf16, fp16) at world 1 (no process group: collectives skipped), and every
stage x offload at world 2 (gloo collectives on the engine's buffers), saves a checkpoint and
the 16-bit model (16-bit runs), and requires the losses to equal the same config's losses
without the canary, bit for bit.

**Autocast.** ``torch.autocast`` on fp32 weights is how most training loops get bf16 compute.
Stage 3's own Linear computes its backward by hand, outside the autocast region; with a
bias-free Linear (TinyGPT's LM head, the usual LLM layer) it multiplied a bf16 gradient by an
fp32 weight and failed. Every stage and offload trains under CPU autocast here and must match
stage 0 under the same autocast (one-process DDP-equivalent reference) within bf16 rounding.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches
from tests.offload_support import ds_config

STEPS = 2
PRECISIONS = ("fp32", "bf16", "fp16")


def _config(stage: int, offload: str, precision: str, root: str) -> dict[str, Any]:
    zero: dict[str, Any] = {}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 0  # gather every parameter
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload, "nvme_path": root}
        if stage == 3:
            zero["offload_param"] = {"device": offload, "nvme_path": root}
    return ds_config(stage, precision, **zero)


def _matrix(world: int) -> list[tuple[int, str, str]]:
    """World 1: every stage x offload x precision. World 2 (gloo collectives on the buffers;
    slower): every stage x offload once, the precisions taking turns."""
    cases = [
        (stage, offload)
        for stage in (0, 1, 2, 3)
        for offload in (("none",) if stage == 0 else ("none", "cpu", "nvme"))
    ]
    if world == 1:
        return [(stage, offload, p) for stage, offload in cases for p in PRECISIONS]
    return [(stage, offload, PRECISIONS[i % 3]) for i, (stage, offload) in enumerate(cases)]


def _train(
    rank: int, world: int, cfg: dict[str, Any], *, canary: bool, autocast: bool, save: str | None
) -> list[float]:
    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize

    set_telemetry(RecordingTelemetry())
    torch.manual_seed(0)
    model = TinyGPT()  # the user's model is built before (and outside) the canary
    data = batches(STEPS, 2 * world, seed=1)
    losses = []
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    if canary:
        torch.set_default_device("meta")
    try:
        engine, *_ = initialize(model=model, config=cfg)
        for x, y in data:
            with cast:
                loss = engine(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        if save is not None:
            engine.save_checkpoint(save, tag="t")
            assert engine.save_16bit_model(save, "model.safetensors")
        engine.destroy()
    finally:
        torch.set_default_device(None)
    return losses


def _canary_ranks(rank: int, world: int, base: str) -> dict[str, Any]:
    if world == 1:
        os.environ.pop("RANK", None)  # a plain `python train.py`: no process group at all
    out: dict[str, Any] = {}
    for i, (stage, offload, precision) in enumerate(_matrix(world)):
        name = f"stage {stage} offload {offload} {precision}"
        root = os.path.join(base, str(i))  # shared by the ranks: the checkpoint goes there
        cfg = _config(stage, offload, precision, root)
        plain = _train(rank, world, cfg, canary=False, autocast=False, save=None)
        save = os.path.join(root, "save") if precision != "fp32" else None
        # A failure is raised, not caught: the other rank may be inside a collective.
        out[name] = (plain, _train(rank, world, cfg, canary=True, autocast=False, save=save))
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_no_buffer_is_left_to_the_default_device(world: int, tmp_path: Path) -> None:
    results = run_ranks(_canary_ranks, world, str(tmp_path), timeout=280)
    for rank_result in results:
        for name, (plain, canary) in rank_result.items():
            assert canary == plain, name


def _autocast_ranks(rank: int, world: int, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stage in (0, 1, 2, 3):
        for offload in ("none",) if stage == 0 else ("none", "cpu"):
            cfg = _config(stage, offload, "fp32", base)
            out[f"{stage}-{offload}"] = _train(
                rank, world, cfg, canary=False, autocast=True, save=None
            )
    return out


def test_every_stage_trains_under_cpu_autocast_like_stage_0(tmp_path: Path) -> None:
    (res, _) = run_ranks(_autocast_ranks, 2, str(tmp_path), timeout=280)
    reference = res["0-none"]
    for name, losses in res.items():
        # bf16 matmuls in forward and backward: the paths sum in different orders.
        assert losses == pytest.approx(reference, rel=2e-2), name
