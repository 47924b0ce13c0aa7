"""A plain PyTorch GPU script with nothing of zeroscope in it: a small MLP trained with DDP or
FSDP2 over NCCL (``--mode``), or alone with a ``dist.barrier()`` each step after
``--sleep-cycles`` of queued device work (``--mode barrier``: the rank's own compute, which its
barrier's host-side wait would hold), for the GPU tests of how an attached job's collectives
are timed (tests/test_gpu_collective_clock.py)."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "fsdp2", "barrier"], required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sleep-cycles", type=int, default=0)
    args = parser.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    if args.mode == "ddp":
        model = DistributedDataParallel(model, bucket_cap_mb=4)
    elif args.mode == "fsdp2":
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        loss = model(torch.randn(64, 1024, device="cuda")).square().mean()
        loss.backward()
        if args.mode == "barrier":
            torch.cuda._sleep(args.sleep_cycles)  # queued: the host is not held by it
            dist.barrier()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
