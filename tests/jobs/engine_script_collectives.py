"""A bundled-engine job whose script issues collectives of its own beside the engine's: a barrier
before ``initialize``, then every step after ``engine.step()`` an all-reduce of its loss (a
log line's mean), a barrier every second step and a broadcast of 64 fp32 values every third.

It writes to ``--out``.RANK its own account: each step's loss (the exact float, hex) and the
collectives it issued itself after that step's end, in order (what the next step's report is
to hold as ``script``), plus the one before ``initialize`` (step 1's). ``--quiet`` issues none
of them: the engine's own collectives alone, the oracle for what the engine issues.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist

from tests.jobs.teardown import end_process_group
from zeroscope.engine import api as deepspeed

CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quiet", action="store_true", help="no collective of the script's own")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    issued: dict[int, list[list[object]]] = {1: []}
    if not args.quiet:
        dist.barrier()
        issued[1].append(["barrier", 0])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=CONFIG
    )
    data = torch.Generator().manual_seed(1 + rank)
    losses = []
    for step in range(1, args.steps + 1):
        x, y = torch.randn(4, 16, generator=data), torch.randn(4, 1, generator=data)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss).hex())
        if args.quiet:
            continue
        after: list[list[object]] = issued.setdefault(step + 1, [])
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        after.append(["all_reduce", 4])
        if step % 2 == 0:
            dist.barrier()
            after.append(["barrier", 0])
        if step % 3 == 0:
            dist.broadcast(torch.full((64,), float(step)), src=0)
            after.append(["broadcast", 256])
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump({"losses": losses, "issued": issued}, f)
    end_process_group()


if __name__ == "__main__":
    main()
