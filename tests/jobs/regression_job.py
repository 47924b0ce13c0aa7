"""A small real data-parallel training job for the multi-node tests: a linear regression whose
gradients are all-reduced over gloo, for a fixed number of steps. It reports through the public
agent API (``zeroscope.agent.api.telemetry``, the engine's seam) when zeroscope launched it and
not at all under plain torchrun (the API is then a no-op). Every rank writes ``STEP LOSS`` lines
to ``OUT_DIR/loss-rank{R}.txt`` (a file, not stdout, which zeroscope's own lines share) so a test
can check the training is the same whatever happened to its telemetry.

Usage (under torchrun): regression_job.py OUT_DIR [STEPS] [STEP_SECONDS]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# Run without the repository on sys.path (as a user's script is): the teardown helper by path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from teardown import end_process_group

from zeroscope.agent.api import telemetry
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts


def main() -> None:
    out_dir = Path(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    pace = float(sys.argv[3]) if len(sys.argv) > 3 else 0.2
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    x = torch.randn(32, 8, generator=data)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.5
    tel = telemetry()
    numel = sum(p.numel() for p in model.parameters())
    tel.hello(
        config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
        params=ParamCounts(total=numel, trainable=numel),
    )
    losses = open(out_dir / f"loss-rank{rank}.txt", "w")  # noqa: SIM115 (closed below)
    for step in range(1, steps + 1):
        with tel.phase("forward"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        with tel.phase("backward"):
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                work = dist.all_reduce(p.grad, async_op=True)
                nbytes = p.grad.numel() * 4
                tel.collective(work, op="all_reduce", nbytes=nbytes, group_size=world).wait()
                p.grad /= world
        with tel.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        tel.step_end(
            memory=MemoryBytes(params=4 * numel, grads=4 * numel, optim=0),
            loss=loss.detach(),
            samples=len(x),
        )
        losses.write(f"{step} {loss.item():.8f}\n")
        time.sleep(pace)
    losses.close()
    tel.close(0)
    end_process_group()


if __name__ == "__main__":
    main()
