"""One rank of the drop-in checks, run once on DeepSpeed 0.19.8 and once on the bundled engine
(``import zeroscope.engine as deepspeed``) by tests/test_deepspeed_dropin.py; every scenario
returns plain values that the test compares between the two engines.

- ``overflow``: a bf16 step with inf/NaN gradients at stage 2 is skipped;
- ``boundary``: accelerate's way of driving the engine: ``set_gradient_accumulation_boundary``
  before each backward, ``backward(loss, scale_wrt_gas=...)``, ``step()`` only at boundaries;
- ``save16``: ``save_16bit_model`` at stages 1 (bf16) and 3 (fp32, gathered), default file
  name and a ``.safetensors`` name;
- ``zero_init``: a model built under ``zero.Init``, read and modified through
  ``GatheredParameters``, adopted by ``initialize`` at stage 3 and trained.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from tests.models import TinyGPT, batches

WORLD = 2


def _deepspeed(engine: str) -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if engine == "deepspeed":
        import deepspeed

        return deepspeed
    import zeroscope.engine as ours

    return ours


def _config(stage: int, precision: str = "fp32", **zero: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
        "zero_optimization": {"stage": stage, **zero},
        "bf16": {"enabled": precision == "bf16"},
    }


def _number(value: Any) -> float | None:
    """A plain float (DeepSpeed answers some of these with 0-d tensors)."""
    return None if value is None else float(value)


def _rows(rank: int) -> slice:
    return slice(2 * rank, 2 * rank + 2)


def boundary(ds: Any, rank: int) -> dict[str, Any]:
    """Steps driven as accelerate drives them; records what the engine answers on the way."""
    torch.manual_seed(0)
    engine, *_ = ds.initialize(model=TinyGPT(), config=_config(2))
    out: dict[str, Any] = {"losses": [], "returned": [], "applied": [], "boundary": []}
    for step, (idx, tgt) in enumerate(batches(6, 4 * WORLD, seed=5)):
        for micro in range(2):
            last = micro == 1
            engine.set_gradient_accumulation_boundary(last)
            out["boundary"].append(engine.is_gradient_accumulation_boundary())
            rows = slice(4 * rank + 2 * micro, 4 * rank + 2 * micro + 2)
            loss = engine(idx[rows], tgt[rows])
            # accelerate passes scale_wrt_gas=False when the loss is normalized already
            returned = engine.backward(loss * 0.5, scale_wrt_gas=step % 2 == 0)
            out["returned"].append(float(returned))
            out["losses"].append(float(loss))
        engine.step()
        out["applied"].append(engine.was_step_applied())
        out.setdefault("lr", []).append(_number(engine.get_lr()[0]))
        out.setdefault("norm", []).append(_number(engine.get_global_grad_norm()))
    out["counters"] = [int(engine.global_steps), int(engine.global_samples), engine.skipped_steps]
    out["config_get"] = _number(engine.config.get("gradient_clipping"))
    engine.zero_grad()
    out["grads_after_zero_grad"] = [p.grad for p in engine.module.parameters()].count(None)
    return out


def overflow(ds: Any, rank: int) -> dict[str, Any]:
    """bf16 at stage 2: a step whose gradients hold inf/NaN is skipped (DeepSpeed's
    ``bf16.check_grad_overflow``, on by default)."""
    torch.manual_seed(0)
    engine, *_ = ds.initialize(model=TinyGPT(), config=_config(2, "bf16"))
    out: dict[str, Any] = {"applied": [], "norm": [], "skipped": []}
    for step, (idx, tgt) in enumerate(batches(3, 4 * WORLD, seed=6)):
        before = [p.detach().float().clone() for p in engine.module.parameters()]
        for micro in range(2):
            rows = slice(4 * rank + 2 * micro, 4 * rank + 2 * micro + 2)
            loss = engine(idx[rows], tgt[rows])
            engine.backward(loss * float("inf") if step == 1 and micro == 0 else loss)
            engine.step()
        out["applied"].append(engine.was_step_applied())
        out["norm"].append(_number(engine.get_global_grad_norm()))
        out["skipped"].append(engine.skipped_steps)
        out.setdefault("unchanged", []).append(
            all(torch.equal(a, b.float()) for a, b in zip(before, engine.module.parameters()))
        )
    return out


def _load(path: Path) -> dict[str, Any]:
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file

            return {"format": "safetensors", "tensors": load_file(path)}
        except Exception:
            pass
    with open(path, "rb") as f:  # a file object: torch.load picks its reader by the file name
        return {"format": "torch.save", "tensors": torch.load(f, weights_only=True)}


def save16(ds: Any, rank: int, folder: str) -> dict[str, Any]:
    out = {}
    for stage, precision in ((1, "bf16"), (3, "fp32")):
        torch.manual_seed(0)
        config = _config(stage, precision, stage3_gather_16bit_weights_on_model_save=True)
        engine, *_ = ds.initialize(model=TinyGPT(), config=config)
        idx, tgt = batches(1, 2 * WORLD, seed=2)[0]
        for _ in range(2):
            engine.backward(engine(idx[_rows(rank)], tgt[_rows(rank)]))
            engine.step()
        where = Path(folder) / f"stage{stage}"
        saved = [
            engine.save_16bit_model(str(where)),
            engine.save_16bit_model(str(where), "m.safetensors"),
        ]
        if rank == 0:
            files = {name: _load(where / name) for name in ("pytorch_model.bin", "m.safetensors")}
            out[f"stage{stage}"] = {
                "saved": saved,
                "files": {
                    name: {
                        "format": f["format"],
                        "tensors": {k: v.float().tolist() for k, v in f["tensors"].items()},
                        "dtypes": sorted({str(v.dtype) for v in f["tensors"].values()}),
                    }
                    for name, f in files.items()
                },
            }
    return out


def zero_init(ds: Any, rank: int) -> dict[str, Any]:
    config = _config(3, stage3_param_persistence_threshold=0)
    torch.manual_seed(0)
    with ds.zero.Init(config_dict_or_path=config):
        model = TinyGPT()
    weight = model.blocks[0].fc.weight  # 37 x 12: not a multiple of the 2 ranks
    out: dict[str, Any] = {
        "placeholder_numel": [p.numel() for p in model.parameters()],
        "ds_numel": [int(p.ds_numel) for p in model.parameters()],
        "ds_shape": [list(p.ds_shape) for p in model.parameters()],
        "shard_numel": [int(p.ds_tensor.numel()) for p in model.parameters()],
    }
    with ds.zero.GatheredParameters(weight, modifier_rank=0):
        out["gathered"] = weight.detach().clone().tolist()
        if rank == 0:
            with torch.no_grad():
                weight.copy_(torch.arange(weight.numel(), dtype=weight.dtype).view(weight.shape))
    out["after_exit_numel"] = weight.numel()
    with ds.zero.GatheredParameters([weight, model.tok.weight]):
        out["modified"] = weight.detach().clone().tolist()
    engine, *_ = ds.initialize(model=model, config=config)
    losses = []
    for idx, tgt in batches(3, 2 * WORLD, seed=4):
        loss = engine(idx[_rows(rank)], tgt[_rows(rank)])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss))
    out["losses"] = losses
    with ds.zero.GatheredParameters(list(engine.module.parameters())):
        out["trained_fc"] = weight.detach().clone().tolist()
    return out


def run(rank: int, world: int, engine: str, folder: str) -> dict[str, Any]:
    ds = _deepspeed(engine)
    ds.init_distributed(dist_backend="gloo")
    return {
        "boundary": boundary(ds, rank),
        "overflow": overflow(ds, rank),
        "save16": save16(ds, rank, folder),
        "zero_init": zero_init(ds, rank),
    }
