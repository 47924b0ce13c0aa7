"""A small job on the bundled engine whose right advice is known, for the advisor's tests: a
stack of identical residual MLP blocks (a ModuleList, so the engine marks them as the model's
repeated blocks), trained on random data for a few steps. Flags make each pitfall happen:

- ``--spike-every K``: every K-th step the loss is multiplied by 1e6 before backward (a loss
  spike: fp16 gradients overflow, bf16's fp32 range holds them);
- ``--checkpoint``: each block runs under activation checkpointing (the code change the
  activations advice asks for);
- ``--diverge-rank R --diverge-step S``: at step S rank R runs its blocks in reverse order (data-
  dependent control flow: same sizes, different parameters, so the collectives still match up
  and the run goes on).

Usage (under ``zeroscope run`` / torchrun): advice_job.py --deepspeed_config PATH [flags]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class Stack(nn.Module):
    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.checkpoint = False
        self.reverse = False

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        from zeroscope.engine.checkpointing import checkpoint

        x = x.to(self.blocks[0].up.weight.dtype)
        for block in reversed(self.blocks) if self.reverse else self.blocks:
            x = checkpoint(block, x) if self.checkpoint else block(x)
        return nn.functional.mse_loss(x.float(), y)


def train(
    config: str | Mapping[str, Any],
    *,
    steps: int = 8,
    width: int = 32,
    layers: int = 4,
    seq: int = 8,
    spike_every: int = 0,
    checkpoint: bool = False,
    diverge_rank: int = -1,
    diverge_step: int = 0,
) -> None:
    """Build the engine and train ``steps`` optimizer steps (call inside a process group)."""
    import torch.distributed as dist

    from zeroscope.engine.api import initialize

    torch.manual_seed(0)
    model = Stack(width, layers)
    model.checkpoint = checkpoint
    engine, _, _, _ = initialize(model=model, config=config)
    rank = dist.get_rank() if dist.is_initialized() else 0
    micro = engine.train_micro_batch_size_per_gpu()
    data = torch.Generator().manual_seed(100 + rank)
    for step in range(1, steps + 1):
        model.reverse = rank == diverge_rank and step == diverge_step
        for _ in range(engine.gradient_accumulation_steps()):
            x = torch.randn(micro, seq, width, generator=data)
            loss = engine(x, x.roll(1, dims=-1))
            if spike_every and step % spike_every == 0:
                loss = loss * 1e6
            engine.backward(loss)
            engine.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed_config", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--spike-every", type=int, default=0)
    parser.add_argument("--checkpoint", action="store_true")
    parser.add_argument("--diverge-rank", type=int, default=-1)
    parser.add_argument("--diverge-step", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("gloo")
    train(
        args.deepspeed_config,
        steps=args.steps,
        width=args.width,
        layers=args.layers,
        seq=args.seq,
        spike_every=args.spike_every,
        checkpoint=args.checkpoint,
        diverge_rank=args.diverge_rank,
        diverge_step=args.diverge_step,
    )
    from tests.jobs.teardown import end_process_group

    end_process_group()  # past torch's gloo teardown abort (exit 134 after the job's work)


if __name__ == "__main__":
    main()
