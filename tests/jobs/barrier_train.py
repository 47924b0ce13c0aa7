"""A plain PyTorch loop with nothing of zeroscope in it whose ranks meet at a ``dist.barrier()``
every step (as scripts do around logging or a checkpoint), one rank computing ``--sleep-ms``
longer than the others before it (the injected straggler), then averaging the gradients with
``all_reduce``, gathering each rank's loss to rank 0 and scattering a learning-rate factor
from it (``dist.gather`` / ``dist.scatter``, whose tensors on a rank hold its share only). Each
rank writes its losses (hex) and the bytes of its gather and scatter shares to ``--out``.RANK."""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist

from tests.jobs.teardown import end_process_group


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--sleep-ms", type=float, default=200.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(rank)
    losses = []
    for _ in range(args.steps):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if rank == args.slow_rank:
            time.sleep(args.sleep_ms / 1e3)  # the straggler's extra compute
        dist.barrier()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
            p.grad /= world
        stats = torch.stack([loss.detach(), loss.detach() ** 2, torch.tensor(float(rank))])
        gathered = [torch.empty(3) for _ in range(world)] if rank == 0 else None
        dist.gather(stats, gathered, dst=0)
        factor = torch.empty(2)
        factors = [torch.full((2,), 1.0 + r) for r in range(world)] if rank == 0 else None
        dist.scatter(factor, factors, src=0)
        opt.step()
        losses.append(loss.item().hex())
    shares = {"gather": stats.nbytes, "scatter": factor.nbytes}
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump({"losses": losses, "shares": shares}, f)
    end_process_group()


if __name__ == "__main__":
    main()
