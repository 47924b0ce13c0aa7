"""ZeRO stage 3 (zeroscope's engine) beside FSDP2 (``torch.distributed.fsdp.fully_shard``) on the
same model, the same batches, in the same run: 2 gloo ranks on CPU, step times alternating
between the contenders round by round, medians reported.

    PYTHONPATH=. python bench/stage3_vs_fsdp.py [--rounds 15] [--dim 128] [--layers 4]

Contenders (all fp32, AdamW, clip 1.0, same initial weights):
- ``fsdp2``: ``fully_shard`` on every block, then on the root (the FSDP2 recipe); parameters
  resharded after forward (its default).
- ``stage3``: DeepSpeed's defaults (prefetch 5e7, reuse distance 1e9, persistence 1e5) but
  ``reduce_bucket_size`` and ``sub_group_size`` = one block (overlapped reduce-scatters, a
  bounded optimizer working set): on a small model most matrices are under the persistence
  threshold (never sharded) and what is sharded stays gathered from forward to backward.
- ``stage3-tight``: reuse distance 0, a one-block prefetch bucket, only biases and LayerNorms
  persistent: parameters released after every use like FSDP2 (the memory-lean setting).

Memory on CPU has no allocator statistics, so peak = model-state bytes each contender holds
(counted from its tensors: parameter shards, gradients, optimizer state) + the transient peak
of the step, measured as the growth of the process's peak RSS over the step (VmHWM after the
step minus VmRSS before it, with ``/proc/self/clear_refs`` resetting the peak; glibc is told to
mmap every allocation over 64 KiB so freed tensors leave the resident set at once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def build_model(args: argparse.Namespace) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, c = x.shape
            q, k, v = (
                z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                for z in self.qkv(self.ln1(x)).split(c, dim=2)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(args.vocab, args.dim)
            self.wpe = nn.Embedding(args.seq, args.dim)
            self.blocks = nn.ModuleList(Block(args.dim, 4) for _ in range(args.layers))
            self.ln_f = nn.LayerNorm(args.dim)
            self.head = nn.Linear(args.dim, args.vocab, bias=False)

        def forward(self, idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.flatten(0, 1), tgt.flatten())

    torch.manual_seed(0)
    return GPT()


class Fsdp2:
    name = "fsdp2"

    def __init__(self, args: argparse.Namespace, world: int) -> None:
        import torch
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.model = build_model(args)
        mesh = init_device_mesh("cpu", (world,))
        for block in self.model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.1)

    def step(self, idx: Any, tgt: Any) -> float:
        import torch

        loss = self.model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.item())

    def state_bytes(self) -> int:
        total = 0
        for p in self.model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
        for state in self.opt.state.values():
            for v in state.values():
                if hasattr(v, "to_local"):
                    v = v.to_local()
                if v.dim() > 0:
                    total += v.numel() * v.element_size()
        return total


class Stage3:
    def __init__(self, args: argparse.Namespace, world: int, *, tight: bool) -> None:
        from zeroscope.engine.api import initialize

        self.name = "stage3-tight" if tight else "stage3"
        model = build_model(args)
        block = sum(p.numel() for p in model.blocks[0].parameters())
        # One block per gradient bucket, so reduce-scatters overlap backward as FSDP2's do.
        zero: dict[str, Any] = {"stage": 3, "reduce_bucket_size": block, "sub_group_size": block}
        if tight:
            zero.update(
                stage3_max_reuse_distance=0,
                stage3_prefetch_bucket_size=block,
                stage3_param_persistence_threshold=4 * args.dim,
            )
        config = {
            "train_micro_batch_size_per_gpu": args.batch,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}},
            "zero_optimization": zero,
        }
        self.engine, *_ = initialize(model=model, config=config)

    def step(self, idx: Any, tgt: Any) -> float:
        loss = self.engine(idx, tgt)
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.item())

    def state_bytes(self) -> int:
        m = self.engine.strategy.memory()
        return int(m.params + m.grads + m.optim)


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

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    contenders: list[Any] = [
        Fsdp2(args, world),
        Stage3(args, world, tight=False),
        Stage3(args, world, tight=True),
    ]
    g = torch.Generator().manual_seed(1)
    data = [
        torch.randint(0, args.vocab, (args.batch * world, args.seq + 1), generator=g)
        for _ in range(args.rounds + args.warmup)
    ]
    mine = slice(rank * args.batch, (rank + 1) * args.batch)
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    transient: dict[str, list[int]] = {c.name: [] for c in contenders}
    first_loss: dict[str, float] = {}
    for r, batch in enumerate(data):
        idx, tgt = batch[mine, :-1], batch[mine, 1:]
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            dist.barrier()
            _reset_peak_rss()
            before = _rss_kib("VmRSS")
            t0 = time.perf_counter()
            loss = c.step(idx, tgt)
            elapsed = time.perf_counter() - t0
            peak = _rss_kib("VmHWM") - before
            first_loss.setdefault(c.name, loss)
            if r >= args.warmup:
                times[c.name].append(elapsed)
                transient[c.name].append(peak * 1024)
    result = {
        c.name: {
            "median_s": statistics.median(times[c.name]),
            "state_bytes": c.state_bytes(),
            "transient_bytes": max(transient[c.name]),
            "first_loss": first_loss[c.name],
        }
        for c in contenders
    }
    out.put((rank, result))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="measured steps per contender")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args(argv)
    os.environ.update(MALLOC_ENV)
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
    base = results[0]["fsdp2"]
    print(
        f"2 ranks, gloo, CPU, {args.threads} thread(s)/rank; GPT dim {args.dim}, "
        f"{args.layers} layers, vocab {args.vocab}, seq {args.seq}, batch {args.batch}/rank; "
        f"{args.rounds} alternating rounds after {args.warmup} warm-up"
    )
    print(
        "| contender | median step (ms) | vs FSDP2 | model states (MiB) | step transient "
        "peak (MiB) | peak (MiB) | first loss |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results[0].items():
        peak = r["state_bytes"] + r["transient_bytes"]
        print(
            f"| {name} | {r['median_s'] * 1e3:.1f} | {r['median_s'] / base['median_s']:.2f}x | "
            f"{r['state_bytes'] / 2**20:.2f} | {r['transient_bytes'] / 2**20:.2f} | "
            f"{peak / 2**20:.2f} | {r['first_loss']:.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
