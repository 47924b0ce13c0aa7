"""A plain compiled PyTorch script with nothing of zeroscope in it: the same small MLP trained
under ``torch.compile`` with DistributedDataParallel, FSDP2 compiled per block, FSDP2 compiled
whole, one after the other in one process.

Per mode and rank it writes each step's loss (the exact float, hex) and what Dynamo itself
counted while the mode ran (``torch._dynamo.utils.counters``: graph breaks, compiled frames,
graphs) to ``--out``.RANK.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

IN, WIDTH, OUT = 16, 24, 3


def build_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, 21),
        torch.nn.Linear(21, OUT),
    )


def wrap(mode: str, model: torch.nn.Sequential, backend: str) -> torch.nn.Module:
    if mode == "ddp":
        return torch.compile(DistributedDataParallel(model), backend=backend)
    if mode == "fsdp2-block":
        for layer in (model[0], model[2]):
            layer.compile(backend=backend)
            fully_shard(layer)
        fully_shard(model)
        return model
    if mode == "fsdp2-whole":
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        return torch.compile(model, backend=backend)
    raise ValueError(mode)


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        "break_reasons": sorted(counters["graph_break"]),
        "frames": dict(counters["frames"]),
    }


def train(mode: str, steps: int, backend: str) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = wrap(mode, build_model(), backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(dist.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(8, IN, generator=data)
        y = torch.randn(8, OUT, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    return {"losses": losses, **dynamo_counts()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="ddp,fsdp2-block,fsdp2-whole")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--backend", default="aot_eager")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = {mode: train(mode, args.steps, args.backend) for mode in args.modes.split(",")}
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
