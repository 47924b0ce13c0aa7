"""A plain compiled PyTorch script: the same small MLP trained under ``torch.compile`` with
DistributedDataParallel, FSDP2 compiled per block, FSDP2 compiled whole, FSDP1 compiled whole,
an eager DDP model whose optimizer step is compiled, and the bundled engine with ``engine.compile()`` (DeepSpeed's API; the only use of zeroscope here, as a user of the
engine would write it), one after the other in one process.

Per mode and rank it writes each step's loss (the exact float, hex) and what Dynamo itself
counted while the mode ran (``torch._dynamo.utils.counters``: graph breaks, compiled frames,
graphs) to ``--out``.RANK.
"""

from __future__ import annotations

import argparse
import gc
import json
import re

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard
from torch.nn.parallel import DistributedDataParallel

from tests.jobs.teardown import end_process_group

IN, WIDTH, OUT = 16, 24, 3


class Block(torch.nn.Module):
    """A user-defined block (Dynamo skips torch.nn's own modules' frames: a model made only of
    them would compile no graph)."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.fc(x)) * 1.5


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(IN, WIDTH), Block(WIDTH, 21)])
        self.head = torch.nn.Linear(21, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model() -> Net:
    torch.manual_seed(0)
    return Net()


def wrap(mode: str, model: Net, backend: str) -> torch.nn.Module:
    if mode == "ddp":
        return torch.compile(DistributedDataParallel(model), backend=backend)
    if mode == "fsdp2-block":
        for block in model.blocks:
            block.compile(backend=backend)
            fully_shard(block)
        fully_shard(model)
        return model
    if mode == "fsdp2-whole":
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return torch.compile(model, backend=backend)
    if mode == "compiled-step":  # an eager DDP model, its optimizer's step() compiled
        return DistributedDataParallel(model)
    if mode == "fsdp1":  # FSDP1's forward issues its all-gathers from Python
        fsdp = FullyShardedDataParallel(model, device_id=torch.device("cpu"), use_orig_params=True)
        return torch.compile(fsdp, backend=backend)
    raise ValueError(mode)


def dynamo_counts() -> dict:
    from torch._dynamo.utils import counters

    return {
        "graph_breaks": sum(counters["graph_break"].values()),
        # A reason may name a function with its address, which differs between processes.
        "break_reasons": sorted(re.sub(r" at 0x[0-9a-f]+", "", r) for r in counters["graph_break"]),
        "frames": dict(counters["frames"]),
        "graphs": counters["stats"]["unique_graphs"],
    }


ENGINE_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "zero_optimization": {"stage": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def train_engine(steps: int, backend: str) -> list[str]:
    from zeroscope.engine.api import initialize

    engine, _, _, _ = initialize(model=build_model(), config=ENGINE_CONFIG)
    engine.compile(backend=backend)
    data = torch.Generator().manual_seed(dist.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(8, IN, generator=data)
        y = torch.randn(8, OUT, generator=data)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item().hex())
    return losses


def train(mode: str, steps: int, backend: str) -> dict:
    import torch._dynamo

    torch._dynamo.reset()
    gc.collect()  # the last mode's model and optimizer, held by what Dynamo compiled, go now
    torch._dynamo.utils.counters.clear()
    if mode == "engine":
        return {"losses": train_engine(steps, backend), **dynamo_counts()}
    model = wrap(mode, build_model(), backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = opt.step
    if mode == "compiled-step":  # PyTorch's compiled-optimizer tutorial: compile around step()

        @torch.compile(backend=backend)
        def step() -> None:
            opt.step()

    data = torch.Generator().manual_seed(dist.get_rank())
    losses = []
    for _ in range(steps):
        x = torch.randn(8, IN, generator=data)
        y = torch.randn(8, OUT, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        step()
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
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
