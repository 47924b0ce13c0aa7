"""A GPU training script for the memory-reserved checks of tests/test_gpu_collective_clock.py:
the bundled engine at ZeRO stage 3 (``--engine zero3``, real collectives at world 1 with
``ZEROSCOPE_WORLD1_COLLECTIVES=1``) or FSDP2 (``--engine fsdp2``, nothing of zeroscope in the
script). It writes the caching allocator's peak reserved bytes and the losses (exact floats,
hex), so one run with the agent and one without can be compared."""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", choices=["zero3", "fsdp2"], required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    data = torch.Generator(device="cuda").manual_seed(1)
    losses: list[str] = []
    if args.engine == "zero3":
        from zeroscope import engine as deepspeed

        config = {
            "train_micro_batch_size_per_gpu": 16,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        }
        m = model()
        engine, _, _, _ = deepspeed.initialize(
            model=m, config=config, model_parameters=m.parameters()
        )
        for _ in range(args.steps):
            x = torch.randn(16, 2048, device="cuda", generator=data, dtype=torch.bfloat16)
            loss = engine(x).float().square().mean()
            engine.backward(loss)
            engine.step()
            losses.append(loss.item().hex())
    else:
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("nccl")
        m = model().cuda()
        for layer in m:
            fully_shard(layer)
        fully_shard(m)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        for _ in range(args.steps):
            x = torch.randn(16, 2048, device="cuda", generator=data)
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item().hex())
    torch.cuda.synchronize()
    out = {"max_reserved": torch.cuda.max_memory_reserved(), "losses": losses}
    with open(args.out, "w") as f:
        json.dump(out, f)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
