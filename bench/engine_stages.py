"""ZeRO stages 0, 1, 2 of zeroscope's engine beside torch DDP and DDP + ZeroRedundancyOptimizer,
on the same small GPT, the same batches, in the same run: 2 gloo ranks on CPU (or CUDA ranks
when run under torchrun on GPUs is added later), contenders alternating round by round (the
order rotates), medians reported, ratios against DDP.

    PYTHONPATH=. python bench/engine_stages.py [--rounds 7] [--steps 4] [--dim 128] [--layers 4]

All contenders: fp32, AdamW(lr 1e-3, weight_decay 0.01), clip 1.0, micro-batch 8, same weights.
- ``ddp``: DistributedDataParallel(gradient_as_bucket_view=True) + torch.optim.AdamW.
- ``ddp+zero_redundancy``: DDP + torch's ZeroRedundancyOptimizer(AdamW) (optimizer state
  sharded, parameters broadcast after the step).
- ``stage0`` / ``stage1`` / ``stage2``: zeroscope's engine with DeepSpeed's defaults
  (overlap_comm off, one 5e8-element bucket, i.e. the whole model here);
  ``stage0+overlap`` / ``stage2+overlap``: overlap_comm on with reduce_bucket_size = 1/8 of the
  model, so bucket reductions run during backward (DDP's way).

Memory on CPU has no allocator statistics, so two figures per contender: model-state bytes
(P + G + O counted from its tensors: parameters, gradients, optimizer state; the engine's
figure is its own report) and the step's transient peak = growth of the process's peak RSS
over a step (VmHWM after it minus VmRSS before, /proc/self/clear_refs resetting the peak;
glibc is told to mmap allocations over 64 KiB so freed tensors leave the resident set).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
CONTENDERS = [
    "ddp",
    "ddp+zero_redundancy",
    "stage0",
    "stage0+overlap",
    "stage1",
    "stage2",
    "stage2+overlap",
]


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def build_model(args: argparse.Namespace) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = (
                z.view(b, t, 4, d // 4).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(args.vocab, args.dim)
            self.pos = nn.Embedding(args.seq, args.dim)
            self.blocks = nn.Sequential(*(Block(args.dim) for _ in range(args.layers)))
            self.ln = nn.LayerNorm(args.dim)
            self.head = nn.Linear(args.dim, args.vocab, bias=False)
            self.head.weight = self.tok.weight
            nn.init.normal_(self.tok.weight, std=0.02)

        def forward(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            logits = self.head(self.ln(self.blocks(x)))
            return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())

    torch.manual_seed(0)
    return GPT()


class TorchContender:
    def __init__(self, args: argparse.Namespace, *, zero_redundancy: bool) -> None:
        import torch
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        self.model = build_model(args)
        self.ddp = DistributedDataParallel(self.model, gradient_as_bucket_view=True)
        kw = {"lr": 1e-3, "weight_decay": 0.01}
        if zero_redundancy:
            self.opt: Any = ZeroRedundancyOptimizer(
                self.model.parameters(), optimizer_class=torch.optim.AdamW, **kw
            )
        else:
            self.opt = torch.optim.AdamW(self.model.parameters(), **kw)
        self.zero_redundancy = zero_redundancy

    def step(self, idx: Any, tgt: Any) -> float:
        import torch

        loss = self.ddp(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)
        return float(loss.detach())

    def state_bytes(self) -> int:
        import torch

        opt = self.opt.optim if self.zero_redundancy else self.opt
        total = sum(p.numel() * p.element_size() for p in self.model.parameters())
        total += sum(
            p.grad.numel() * p.grad.element_size()
            for p in self.model.parameters()
            if p.grad is not None
        )
        for state in opt.state.values():
            total += sum(
                t.numel() * t.element_size()
                for t in state.values()
                if torch.is_tensor(t) and t.numel() > 1
            )
        return total


class EngineContender:
    def __init__(self, args: argparse.Namespace, stage: int, overlap: bool) -> None:
        from zeroscope.engine.api import initialize

        model = build_model(args)
        psi = sum(p.numel() for p in model.parameters())
        zero: dict[str, Any] = {"stage": stage}
        if overlap:
            zero.update(overlap_comm=True, reduce_bucket_size=max(1, psi // 8))
        cfg = {
            "train_micro_batch_size_per_gpu": args.batch,
            "steps_per_print": 0,
            "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        }
        self.engine, _, _, _ = initialize(model=model, config=cfg)

    def step(self, idx: Any, tgt: Any) -> float:
        loss = self.engine(idx, tgt)
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.detach())

    def state_bytes(self) -> int:
        m = self.engine.strategy.memory()
        return m.params + m.grads + m.optim


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    contenders: dict[str, Any] = {
        "ddp": TorchContender(args, zero_redundancy=False),
        "ddp+zero_redundancy": TorchContender(args, zero_redundancy=True),
        "stage0": EngineContender(args, 0, False),
        "stage0+overlap": EngineContender(args, 0, True),
        "stage1": EngineContender(args, 1, False),
        "stage2": EngineContender(args, 2, False),
        "stage2+overlap": EngineContender(args, 2, True),
    }
    g = torch.Generator().manual_seed(1 + rank)
    data = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1), generator=g)
    times: dict[str, list[float]] = {n: [] for n in contenders}
    peaks: dict[str, list[int]] = {n: [] for n in contenders}
    losses: dict[str, float] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms up and is dropped
        order = CONTENDERS[rnd % len(CONTENDERS) :] + CONTENDERS[: rnd % len(CONTENDERS)]
        for name in order:
            c = contenders[name]
            dist.barrier()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            before = _kib("VmRSS")
            t0 = time.perf_counter()
            for s in range(args.steps):
                losses[name] = c.step(data[s, :, :-1], data[s, :, 1:])
            dist.barrier()
            elapsed = (time.perf_counter() - t0) / args.steps
            if rnd:
                times[name].append(elapsed)
                peaks[name].append((_kib("VmHWM") - before) * 1024)
    if rank == 0:
        psi = sum(p.numel() for p in build_model(args).parameters())
        out.put(
            {
                "psi": psi,
                "time": {n: statistics.median(v) for n, v in times.items()},
                "peak": {n: statistics.median(v) for n, v in peaks.items()},
                "state": {n: c.state_bytes() for n, c in contenders.items()},
                "loss": losses,
            }
        )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=4, help="steps per contender per round")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    os.environ.update(MALLOC_ENV)
    import multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=1800)
    for p in procs:
        p.join()
    base = result["time"]["ddp"]
    print(
        f"small GPT: {result['psi']:,} parameters, 2 gloo ranks on CPU, fp32, "
        f"{args.rounds} rounds x {args.steps} steps, medians\n"
    )
    print(
        "| contender | step ms | vs ddp | model-state MiB/rank | step transient peak MiB | last loss |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in CONTENDERS:
        print(
            f"| {name} | {result['time'][name] * 1e3:.1f} | {result['time'][name] / base:.2f} | "
            f"{result['state'][name] / 2**20:.2f} | {result['peak'][name] / 2**20:.1f} | "
            f"{result['loss'][name]:.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
