"""A DeepSpeed training script with nothing of zeroscope in it: a small sweep that trains the
same model under each ds_config given, one after the other, in one process (one launch for
several configs: DeepSpeed takes tens of seconds to start).

For each config it writes, per rank, what DeepSpeed itself says after every step: the loss (the
exact float, hex), ``skipped_steps``, the loss scale, ``global_steps``, the lr each update used (read before
``step()``, which moves a DeepSpeed scheduler on); the attach tests compare
those with the trace ``zeroscope run`` recorded, and with the same script under bare torchrun.
"""

from __future__ import annotations

import argparse
import json

import deepspeed
import torch
import torch.distributed as dist

WIDTH = 48


def build_model() -> torch.nn.Module:
    """Parameter sizes chosen so partitions are uneven (padding shows in the byte counts)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, 5),
    )


def train(config_path: str, steps: int, save: str = "", load: str = "") -> dict:
    with open(config_path) as f:
        config = json.load(f)
    model = build_model()
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=config, model_parameters=model.parameters()
    )
    if load:  # a resumed run: DeepSpeed's own checkpoint of an earlier launch
        engine.load_checkpoint(load)
    dtype = (
        torch.bfloat16
        if engine.bfloat16_enabled()
        else torch.float16
        if engine.fp16_enabled()
        else torch.float32
    )
    data = torch.Generator().manual_seed(1000 + dist.get_rank())
    record: dict = {"losses": [], "skipped": [], "scale": [], "global_steps": [], "lr": []}
    micro = engine.gradient_accumulation_steps()
    for _ in range(steps * micro):
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 32, generator=data)
        y = torch.randn(engine.train_micro_batch_size_per_gpu(), 5, generator=data)
        out = engine(x.to(dtype))
        loss = torch.nn.functional.mse_loss(out.float(), y)
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():  # the lr this update uses
            record["lr"].append(float(engine.get_lr()[0]))
        engine.step()
        record["losses"].append(loss.item().hex())
        record["skipped"].append(engine.skipped_steps)
        scale = getattr(engine.optimizer, "cur_scale", None)
        record["scale"].append(float(scale) if scale is not None else None)
        record["global_steps"].append(engine.global_steps)
    # DeepSpeed's own grouping: the element count of each parameter, per flat group, in order.
    # (ZeRO-1/2's bit16_groups, the stage-0 fp16 optimizer's fp16_groups, bf16's bf16_groups)
    opt = engine.optimizer
    groups = next(
        g
        for name in ("bit16_groups", "fp16_groups", "bf16_groups")
        if (g := getattr(opt, name, None))
    )
    record["groups"] = [[int(getattr(p, "ds_numel", p.numel())) for p in g] for g in groups]
    if save:
        engine.save_checkpoint(save)
    engine.destroy()
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", required=True, help="comma-separated ds_config paths")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True, help="JSON file prefix (.RANK is appended)")
    parser.add_argument("--save", default="", help="a checkpoint directory, written at the end")
    parser.add_argument("--load", default="", help="a checkpoint directory to resume from")
    args = parser.parse_args()
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    paths = args.configs.split(",")
    assert len(paths) == 1 or not (args.save or args.load), "--save/--load take one config"
    results = {path: train(path, args.steps, args.save, args.load) for path in paths}
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
