"""Helpers of the stage-3 tests (no tests here): a tiny GPT, an independent one-process AdamW
reference, a driver of the strategy protocol, and a telemetry recorder.

The driver follows the call order documented in ``engine/zero/strategy.py`` with plain torch
ops, so the tests check stage 3 itself against ``torch.optim.AdamW`` + ``clip_grad_norm_``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from zeroscope.agent.api import Telemetry, Waitable

VOCAB, WIDTH, SEQ = 61, 32, 8
"""61: the LM head's bias does not divide by 2 or 4 ranks, so padding is exercised."""
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for z in self.qkv(self.ln1(x)).split(c, dim=2)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    """GPT-2 shaped: token + position embeddings, blocks, final LayerNorm, LM head (tied to the
    token embedding when ``tie``: one parameter used by two modules). ``repeat`` runs the
    block stack that many times (modules called more than once per forward)."""

    def __init__(self, *, layers: int = 2, tie: bool = True, repeat: int = 1) -> None:
        super().__init__()
        self.repeat = repeat
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(WIDTH, 2) for _ in range(layers))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.reverse = False
        """Run the blocks in reverse order: a different module order, for trace re-learning."""
        if tie:
            self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for _ in range(self.repeat):
            for block in reversed(self.blocks) if self.reverse else self.blocks:
                x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def make_model(seed: int = 0, **kw: Any) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(**kw)


def batches(
    steps: int, micro: int, rows: int, seed: int = 1
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """``steps`` x ``micro`` global micro-batches of ``rows`` sequences (split over ranks)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        step = []
        for _ in range(micro):
            idx = torch.randint(0, VOCAB, (rows, SEQ), generator=g)
            step.append((idx, torch.roll(idx, -1, dims=1)))
        out.append(step)
    return out


@dataclass
class Hyper:
    lr: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip: float = 0.5


def reference_losses(model: TinyGPT, data: list, hp: Hyper, flip_at: int = -1) -> list[float]:
    """One process, fp32, torch.optim.AdamW + clip_grad_norm_: the truth."""
    opt = torch.optim.AdamW(
        model.parameters(), lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay
    )
    losses = []
    for n, step in enumerate(data):
        model.reverse = n >= flip_at >= 0
        opt.zero_grad()
        total = 0.0
        for idx, tgt in step:
            loss = model(idx, tgt) / len(step)
            loss.backward()
            total += loss.item()
        if hp.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp.clip)
        opt.step()
        losses.append(total)
    return losses


class Recorder(Telemetry):
    """Keeps every collective the engine reports (op, bytes, prefetched)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, bool]] = []

    def collective(
        self,
        work: Waitable,
        *,
        op: Any,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
    ) -> Waitable:
        self.records.append((op, nbytes, prefetched))
        return work

    def bytes_of(self, op: str) -> int:
        return sum(n for o, n, _ in self.records if o == op)


@dataclass
class Run:
    losses: list[float] = field(default_factory=list)
    steps_memory: list[Any] = field(default_factory=list)
    comm_per_step: list[dict[str, int]] = field(default_factory=list)
    skipped: int = 0


def train_stage3(
    strategy: Any,
    model: nn.Module,
    data: list,
    hp: Hyper,
    *,
    rank: int,
    world: int,
    precision: str,
    recorder: Recorder | None = None,
    loss_scale: float = 1.0,
    flip_at: int = -1,
) -> Run:
    """Drive the strategy protocol for ``len(data)`` optimizer steps on this rank's slice."""
    from zeroscope.engine.optim import AdamHyper, adam_step

    adam = AdamHyper(lr=hp.lr, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay)
    run = Run()
    for n, step in enumerate(data):
        model.reverse = n >= flip_at >= 0
        mark = len(recorder.records) if recorder else 0
        total = torch.zeros(1)
        for i, (idx, tgt) in enumerate(step):
            rows = idx.shape[0] // world
            mine = slice(rank * rows, (rank + 1) * rows)
            strategy.begin_micro_step(boundary=i == len(step) - 1)
            loss = model(idx[mine], tgt[mine]) / len(step)
            (loss * loss_scale).backward()
            strategy.end_micro_step()
            total += loss.detach().float()
        grads = strategy.reduced_grads()
        bad = torch.stack([~torch.isfinite(g).all() for g in grads]).any().float().reshape(1)
        sq = torch.stack([g.float().square().sum() for g in grads]).sum().reshape(1)
        if world > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
            dist.all_reduce(sq)
            dist.all_reduce(total)
        run.losses.append(total.item() / world)
        if bad.item():
            run.skipped += 1
            strategy.zero_grads()
            continue
        norm = math.sqrt(sq.item()) / loss_scale
        coef = hp.clip / (norm + 1e-6) if hp.clip > 0 else 1.0
        for shard, g in zip(strategy.shards, grads):
            g32 = g.float() / loss_scale
            if coef < 1.0:
                g32 = g32 * coef
            adam_step(shard.master, g32, shard.state, adam)
        strategy.publish_params()
        strategy.zero_grads()
        run.steps_memory.append(strategy.memory())
        if recorder:
            new = recorder.records[mark:]
            run.comm_per_step.append(
                {
                    op: sum(n for o, n, _ in new if o == op)
                    for op in ("all_gather", "reduce_scatter")
                }
            )
    return run
