"""Stage 3 through the engine's front door (``initialize`` + ds_config), on the project's tiny
GPT (tied weights, a block called four times per forward, odd sizes), against one-process
AdamW; its reports through the agent seam; ``engine.save_16bit_model``."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches

STEPS, MICRO, ACCUM = 20, 2, 2
HYPER = {"lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
THRESHOLD = 40  # LayerNorms and most biases persistent


def _config(precision: str, folder_save: bool) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": ACCUM,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": HYPER},
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": THRESHOLD,
            "stage3_prefetch_bucket_size": 1500,
            "stage3_max_live_parameters": 2000,
            "stage3_max_reuse_distance": 300,
            "reduce_bucket_size": 800,
            "stage3_gather_16bit_weights_on_model_save": folder_save,
        },
    }
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 10}
    elif precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def _rows(micro: int, rank: int, world: int) -> slice:
    start = (micro * world + rank) * MICRO
    return slice(start, start + MICRO)


def _engine_run(
    rank: int, world: int, precision: str, folder: str, steps: int = STEPS
) -> dict[str, Any]:
    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize

    tel = RecordingTelemetry()
    set_telemetry(tel)
    torch.manual_seed(0)
    engine, *_ = initialize(model=TinyGPT(), config=_config(precision, bool(folder)))
    losses = []
    for idx, tgt in batches(steps, MICRO * world * ACCUM, seed=3):
        total = torch.zeros(1)
        for micro in range(ACCUM):
            rows = _rows(micro, rank, world)
            loss = engine(idx[rows], tgt[rows])
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        if world > 1:
            dist.all_reduce(total)
        losses.append(total.item() / (world * ACCUM))
    saved = engine.save_16bit_model(folder) if folder else None
    with torch.no_grad():
        idx, tgt = batches(1, 3, seed=9)[0]
        out = engine(idx, tgt).item()
    set_telemetry(None)
    ops = {
        op: sum(1 for s in tel.steps for c in s.collectives if c.op == op)
        for op in ("all_gather", "reduce_scatter")
    }
    hello = tel.hellos[0]["params"]
    return {
        "hello": (hello.total, hello.persistent, hello.padded_total, hello.largest_layer),
        "losses": losses,
        "memory": [s.memory for s in tel.steps],
        "ops": ops,
        "saved": saved,
        "out": out,
    }


def _reference(world: int = 2, steps: int = STEPS) -> list[float]:
    torch.manual_seed(0)
    model = TinyGPT()
    betas = (HYPER["betas"][0], HYPER["betas"][1])
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=HYPER["lr"],
        betas=betas,
        eps=HYPER["eps"],
        weight_decay=HYPER["weight_decay"],
    )
    losses = []
    for idx, tgt in batches(steps, MICRO * world * ACCUM, seed=3):
        opt.zero_grad()
        total = 0.0
        for micro in range(ACCUM):
            rows = slice(micro * world * MICRO, (micro + 1) * world * MICRO)
            loss = model(idx[rows], tgt[rows]) / ACCUM
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        losses.append(total)
    return losses


@pytest.mark.parametrize(("precision", "rel"), [("fp32", 1e-5), ("fp16", 3e-3), ("bf16", 2e-2)])
def test_engine_stage3_trains_like_adamw(precision: str, rel: float, tmp_path: Any) -> None:
    """fp32 tight; 16-bit within ``rel`` of the fp32 one-process run at every step. The bf16
    run also saves the consolidated 16-bit model, which must reproduce the engine's output."""
    folder = str(tmp_path) if precision == "bf16" else ""
    # 20 steps in fp32; 10 in 16 bits (tests/test_stage3.py runs those 20 steps at a lower level)
    steps = STEPS if precision == "fp32" else STEPS // 2
    runs = run_ranks(_engine_run, 2, precision, folder, steps)
    assert runs[0]["losses"] == pytest.approx(_reference(steps=steps), rel=rel)
    e = 4 if precision == "fp32" else 2
    model = TinyGPT()
    padded = sum(math.ceil(p.numel() / 2) * 2 for p in model.parameters())
    persistent = sum(p.numel() for p in model.parameters() if p.numel() <= THRESHOLD)
    largest_module = max(
        sum(math.ceil(p.numel() / 2) * 2 for p in m.parameters(recurse=False))
        for m in model.modules()
    )
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    total = sum(p.numel() for p in model.parameters())
    for run in runs:
        assert run["hello"] == (total, persistent, padded, largest)
        memory = run["memory"][-1]
        assert memory.params + memory.grads + memory.optim == 16 * padded // 2 + e * persistent
        assert memory.persistent_params == e * persistent
        peak = max(m.gathered_params for m in run["memory"])
        assert 0 < peak <= e * (2000 + largest_module)
        assert run["ops"]["all_gather"] > 0 and run["ops"]["reduce_scatter"] > 0
    if folder:
        from zeroscope.engine.zero.stage3.save import load_16bit_model

        assert [r["saved"] for r in runs] == [True, True]
        plain = TinyGPT().to(torch.bfloat16)
        plain.load_state_dict(load_16bit_model(tmp_path / "pytorch_model.bin"), strict=True)
        with torch.no_grad():
            idx, tgt = batches(1, 3, seed=9)[0]
            assert plain(idx, tgt).item() == runs[0]["out"]


def test_engine_stage3_in_one_plain_process() -> None:
    """No torchrun, no process group: N = 1, every collective a local copy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = _engine_run(0, 1, "fp32", "", steps=6)
    finally:
        torch.set_num_threads(threads)
    assert run["losses"] == pytest.approx(_reference(world=1, steps=6), rel=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stage3_state_dict_resumes_exactly(precision: str) -> None:
    """2 steps, save the strategy's state, a fresh engine (other initial weights) loads it,
    2 more steps == 4 uninterrupted steps, bitwise (one process)."""
    from zeroscope.engine.api import initialize

    cfg: dict[str, Any] = {
        "train_batch_size": 2,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": THRESHOLD},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    data = batches(4, 2, seed=5)

    def train(engine: Any, steps: list) -> None:
        for x, y in steps:
            engine.backward(engine(x, y))
            engine.step()

    torch.manual_seed(0)
    straight, *_ = initialize(model=TinyGPT(), config=cfg)
    train(straight, data)
    torch.manual_seed(0)
    first, *_ = initialize(model=TinyGPT(), config=cfg)
    train(first, data[:2])
    saved = first.strategy.state_dict()
    torch.manual_seed(1)
    resumed, *_ = initialize(model=TinyGPT(), config=cfg)
    resumed.strategy.load_state_dict(saved)
    train(resumed, data[2:])
    a = straight.strategy.consolidated_16bit_state_dict()
    b = resumed.strategy.consolidated_16bit_state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(straight.strategy.master, resumed.strategy.master)
