"""A plain PyTorch script with nothing of zeroscope in it: a two-stage pipeline with
``torch.distributed.pipelining`` (one ``PipelineStage`` per rank, ``Schedule1F1B`` over four
micro-batches, the loss function given to the schedule, which computes it on the last stage).

Per rank it writes to ``--out``.RANK each step's loss as the script reads it (the mean of the
micro-batch losses the schedule hands back; None on the first stage, which computes none), as
the exact float (hex): the job's own figure, which a recording must show.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from tests.jobs.teardown import end_process_group

WIDTH = 16
MICROBATCHES = 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    stage_module = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 2 * WIDTH), torch.nn.ReLU(), torch.nn.Linear(2 * WIDTH, WIDTH)
    )
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    schedule = Schedule1F1B(
        stage, n_microbatches=MICROBATCHES, loss_fn=torch.nn.functional.mse_loss
    )
    opt = torch.optim.SGD(stage_module.parameters(), lr=0.05)
    torch.manual_seed(100)  # the same batches on every rank: the first stage reads x, the last y
    log = []
    for step in range(1, args.steps + 1):
        x, y = torch.randn(2 * MICROBATCHES, WIDTH), torch.randn(2 * MICROBATCHES, WIDTH)
        losses: list[torch.Tensor] = []
        if stage.is_first:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=losses)
        opt.step()
        opt.zero_grad()
        mean = (sum(float(v) for v in losses) / len(losses)) if losses else None
        log.append({"step": step, "loss": None if mean is None else mean.hex()})
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(log, f)
    end_process_group()


if __name__ == "__main__":
    main()
