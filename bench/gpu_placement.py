"""The GPU slot's check of stage 3's start-up placement: without ``zero.Init`` the engine moves
the parameters to the GPU one at a time as it partitions them, so a model starts where a second
full copy of it would not fit. On one GPU the shards are the whole model (world 1), so the cap
sits between one and two 16-bit copies: 1.6x the model, above what the process holds already.

Two verdicts, each from its own run under the same cap: the engine starts, steps once, and its
start-up peak is the shards plus one parameter (tests/test_stage3_placement.py asserts the
same); and a control: the old path, the whole model moved first (``model.to(device, bf16)``
before ``initialize()``, what ``initialize()`` itself did before), runs out of memory under that
cap, so the cap can tell the two apart. NA on the CPU, where nothing caps the allocator (the CPU
test counts full copies with a dispatch canary instead).
"""

from __future__ import annotations

import gc
import math
from typing import Any

from bench.gpu_checks import Verdict, guarded, verdict

WIDTH, LAYERS, CAP = 4096, 16, 1.6  # 512 MiB of 16-bit parameters, 32 MiB the largest
MiB = 2**20
ITEM = "stage 3 without zero.Init starts under a cap of 1.6 models (one at a time)"
CONTROL = "control: the whole model moved first hits the same cap"


def _model() -> Any:
    """The tests' frozen stack (tests/test_stage3_placement.py): start-up memory is parameters."""
    import torch

    from tests.test_stage3_placement import FrozenStack

    torch.manual_seed(0)
    return FrozenStack(WIDTH, LAYERS)


CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 4,
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
    },
}


def _under_cap(device: Any, moved_first: bool) -> dict[str, Any]:
    import torch

    from zeroscope.engine.api import initialize

    gc.collect()
    torch.cuda.empty_cache()
    model16 = LAYERS * WIDTH * WIDTH * 2
    total = torch.cuda.get_device_properties(device).total_memory
    cap = torch.cuda.memory_reserved(device) + int(CAP * model16)
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    engine = model = None
    try:
        model = _model()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        try:
            if moved_first:
                model.to(device=device, dtype=torch.bfloat16)
            engine, *_ = initialize(model=model, config=CONFIG)
        except torch.OutOfMemoryError:
            return {"started": False, "peak_MiB": None}
        peak = torch.cuda.max_memory_allocated(device) - before
        loss = engine(torch.randn(4, WIDTH, device=device))
        engine.backward(loss)
        engine.step()
        return {
            "started": True,
            "peak_MiB": round(peak / MiB, 1),
            "shards_MiB": round(engine.strategy.partition.shard_bytes / MiB, 1),
            "loss": float(loss.detach()),
        }
    finally:
        del engine, model
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def placement_verdicts(device: Any) -> list[Verdict]:
    """The check and its control (see the module docstring)."""
    if device.type != "cuda":
        why = "no GPU (tests/test_stage3_placement.py counts full copies with a canary)"
        return [verdict(ITEM, None, why), verdict(CONTROL, None, why)]

    def started() -> Verdict:
        got = _under_cap(device, moved_first=False)
        largest = WIDTH * WIDTH * 2 / MiB
        ok = got["started"] and got["peak_MiB"] <= got["shards_MiB"] + largest + 8
        return verdict(ITEM, bool(ok and math.isfinite(got["loss"])), got)

    def control() -> Verdict:
        got = _under_cap(device, moved_first=True)
        return verdict(CONTROL, not got["started"], got)

    return [guarded(ITEM, started), guarded(CONTROL, control)]
