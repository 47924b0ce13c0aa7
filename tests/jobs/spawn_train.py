"""The shape of PyTorch's DDP tutorial: the script starts its own ranks with
``torch.multiprocessing.spawn`` (run as ``python spawn_train.py``), each rendezvousing on the
port the script picks. Each rank writes its losses (``repr``: every bit) and its process id to
``--out``.RANK. ``--fail-at S``: rank 1 raises at step S (torch's spawn then exits it with 1,
stops the other rank and raises in the parent). ``--start-method fork``: the ranks are forked
(``mp.start_processes``), and leave through ``os._exit`` as multiprocessing's forked children
do. ``--start-method process``: each rank is an ``mp.Process`` the script starts and joins, as
PyTorch's "Writing Distributed Applications" tutorial does (``set_start_method("spawn")``)."""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.jobs.teardown import end_process_group


def worker(rank: int, world: int, port: int, steps: int, fail_at: int, out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    losses = []
    for step in range(1, steps + 1):
        loss = model(torch.randn(16, 32, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(repr(loss.item()))
        if rank == 1 and step == fail_at:
            raise RuntimeError(f"rank 1 broke at step {step}")
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"losses": losses, "pid": os.getpid(), "param_bytes": params}, f)
    end_process_group()  # past torch's gloo teardown abort (a CI run's reference aborted)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--start-method", default="spawn")
    a = parser.parse_args()
    print(f"spawner {os.getpid()}", flush=True)
    args = (2, a.port, a.steps, a.fail_at, a.out)
    if a.start_method == "spawn":
        mp.spawn(worker, args=args, nprocs=2, join=True)
    elif a.start_method == "process":
        mp.set_start_method("spawn")
        ranks = [mp.Process(target=worker, args=(rank, *args)) for rank in range(2)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
        raise SystemExit(max(p.exitcode or 0 for p in ranks) and 1)
    else:
        mp.start_processes(worker, args=args, nprocs=2, join=True, start_method=a.start_method)
