"""A plain PyTorch mixed-precision script with nothing of zeroscope in it: ``torch.autocast`` on
the CPU (fp16 by default), ``torch.amp.GradScaler("cpu")`` (FSDP's ``ShardedGradScaler`` in
an FSDP2 run), gradient accumulation (DDP's ``no_sync()`` on all but the last micro-batch)
and non-reentrant activation checkpointing, clipping the unscaled gradients
(``scaler.unscale_``, ``clip_grad_norm_``).

``--runs`` trains several runs one after the other in one process (a fresh model, optimizer
and scaler each). Per step it prints and writes to ``--out``.RANK its own account: the mean of the micro-batch
losses it handed to ``scaler.scale()`` (the exact float, hex), the scale after
``scaler.update()``, and whether the scaler found inf/nan gradients (the scaler's own
``found_inf`` for the optimizer, read before ``update()``: the step was skipped), and the norm
``clip_grad_norm_`` returned (inf or nan in a step that overflowed).
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from tests.jobs.teardown import end_process_group

IN, WIDTH, OUT = 32, 48, 4


class Block(torch.nn.Module):
    """A residual MLP block whose activations are recomputed in backward (non-reentrant)."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(IN, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.out = torch.nn.Linear(WIDTH, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def build(mode: str) -> tuple[torch.nn.Module, type]:
    torch.manual_seed(0)
    model = Net()
    if mode == "ddp":
        return DistributedDataParallel(model), torch.amp.GradScaler
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, ShardedGradScaler


def train(spec: str, accum: int, dtype: torch.dtype, rank: int) -> list[dict]:
    """One run: ``spec`` is ``mode:init_scale:growth_interval:steps``."""
    mode, init_scale, growth_interval, n = spec.split(":")
    model, scaler_cls = build(mode)
    scaler = scaler_cls("cpu", init_scale=float(init_scale), growth_interval=int(growth_interval))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)
    steps = []
    for step in range(1, int(n) + 1):
        micro = []
        for m in range(accum):
            x = torch.randn(8, IN, generator=data)
            y = torch.randn(8, OUT, generator=data)
            last = m == accum - 1
            sync: contextlib.AbstractContextManager = contextlib.nullcontext()
            if mode == "ddp" and not last:
                sync = model.no_sync()
            elif mode == "fsdp2":
                model.set_requires_gradient_sync(last)
            with sync:
                with torch.autocast("cpu", dtype=dtype):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                scaler.scale(loss).backward()
            micro.append(loss.item())
        scaler.unscale_(opt)  # clipping the true gradients (torch.amp's documented recipe)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
            norm = norm.full_tensor()
        scaler.step(opt)
        found = scaler._found_inf_per_device(opt)
        skipped = bool(sum(float(v.item()) for v in found.values()))
        scaler.update()
        opt.zero_grad()
        mean = sum(micro) / len(micro)
        scale = scaler.get_scale()
        own = {"loss": mean.hex(), "scale": scale, "skipped": skipped}
        steps.append({**own, "grad_norm": norm.item().hex()})
        print(f"{spec} rank {rank} step {step} loss {mean:.6f} scale {scale:g} skipped {skipped}")
    return steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="ddp:32768:1:8", help="mode:init_scale:growth:steps,...")
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    runs = [train(spec, args.accum, dtype, rank) for spec in args.runs.split(",")]
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump({"runs": runs}, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
