"""A plain PyTorch script with nothing of zeroscope in it: a two-rank tensor-parallel MLP, as
DTensor's ``parallelize_module`` builds one (column- then row-parallel linears, twice, on a 1-D
``DeviceMesh`` named ``tp``).

Its collectives are DTensor's functional ones (``torch.ops._c10d_functional.all_reduce``: each
row-parallel output in forward, the second column-parallel input's gradient in backward), which
call the group's backend from C++ and pass through no ``ProcessGroup`` method. Each step also
averages the loss over the ranks with a plain ``dist.all_reduce`` on the same group (a call the
attach wraps itself: it must be counted once).

Per rank it writes to ``--out``.RANK each step's loss (the exact float, hex), the functional
all-reduces torch's own ``CommDebugMode`` counted in the step and the batch's shape: the job's
own count, which a recording must match.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from tests.jobs.teardown import end_process_group

WIDTH = 16
HIDDEN = 32
BATCH = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, WIDTH),
        torch.nn.Linear(WIDTH, HIDDEN),
        torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, WIDTH),
    )
    plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
    plan |= {"3": ColwiseParallel(), "5": RowwiseParallel()}
    net = parallelize_module(net, mesh, plan)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    torch.manual_seed(1)  # the same batches on both ranks: tensor parallelism splits the model
    log = []
    for step in range(1, args.steps + 1):
        x = torch.randn(BATCH, WIDTH)
        counted = CommDebugMode()
        with counted:
            loss = (net(x) ** 2).mean()
            loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the ranks' losses averaged: a call through ProcessGroup
        functional = sum(counted.get_comm_counts().values())
        log.append(
            {
                "step": step,
                "loss": (mean / 2).item().hex(),
                "functional": functional,
                "shape": [BATCH, WIDTH],
            }
        )
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(log, f)
    end_process_group()


if __name__ == "__main__":
    main()
