"""A tiny character-level GPT trained the way a DeepSpeed script trains, on the bundled engine.

    zeroscope run --nproc-per-node 2 examples/train_gpt.py [--steps 200]
    zeroscope run --nproc-per-node 2 examples/train_gpt.py --pipeline   # 2 pipeline stages

``--pipeline`` builds the same model as a DeepSpeed ``PipelineModule`` (embedding, blocks, head
as LayerSpecs; examples/ds_config_pipeline.json: ZeRO-2 under 1F1B, which DeepSpeed itself
refuses) and trains it with ``engine.train_batch()``; the Pipeline screen (``p``) shows its
stages, micro-batches and bubbles.

Written like a DeepSpeed user script (``--deepspeed_config``, ``initialize`` returning the
engine, then ``engine(batch)``, ``engine.backward(loss)``, ``engine.step()``), so what zeroscope
shows here is what it shows on a real one. The corpus (examples/tiny_corpus.txt) is a few KB of
text written for this repo; every rank draws its own batches from a rank-seeded generator.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

HERE = Path(__file__).resolve().parent


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP (GPT-2 layout)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int, block: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


class Embed(nn.Module):
    """Token + position embeddings: the first pipeline layer."""

    def __init__(self, vocab: int, block: int, width: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(block, width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class Head(nn.Module):
    """Final norm and logits: the last pipeline layer (the loss is the module's loss_fn)."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln(x))


def say(line: str) -> None:
    """One line in one write: the job shares its terminal with zeroscope's own step lines, and
    print() on an unbuffered stdout writes the text and its newline apart, so another
    process's line could land between them."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


_LAST_BARRIER: list[object] = []


def end_process_group() -> None:
    """Every rank past its last collective, then the group's end. The barrier's Work is kept
    for the rest of the process: torch (2.13) can abort a process whose interpreter is already
    exiting when one of gloo's worker threads lets go of a finished collective's tensors
    ("terminate called without an active exception"); kept, the collectives the barrier waited
    for are freed by the interpreter itself (tests/jobs/teardown.py says how)."""
    work = dist.barrier(async_op=True)
    if work is not None:
        work.wait()
        _LAST_BARRIER.append(work)
    dist.destroy_process_group()


def train_pipeline(args: argparse.Namespace, data: torch.Tensor, vocab: int) -> None:
    """The same GPT as a PipelineModule, trained with ``train_batch()``."""
    from zeroscope.engine import api as deepspeed
    from zeroscope.engine.parallel.pipe import LayerSpec, PipelineModule

    layers = [
        LayerSpec(Embed, vocab, args.block, args.width),
        *[LayerSpec(Block, args.width, args.heads) for _ in range(args.layers)],
        LayerSpec(Head, vocab, args.width),
    ]
    torch.manual_seed(args.seed)
    net = PipelineModule(
        layers, num_stages=args.stages, loss_fn=next_token_loss, partition_method="uniform"
    )
    config = args.deepspeed_config
    if config == str(HERE / "ds_config.json"):
        config = str(HERE / "ds_config_pipeline.json")
    engine, *_ = deepspeed.initialize(model=net, config=config)
    micro_batch = engine.train_micro_batch_size_per_gpu()
    dp_rank = engine.grid.get_data_parallel_rank()
    batches = torch.Generator().manual_seed(args.seed + 1 + dp_rank)

    def micro_batches():  # read by the first stage (inputs) and the last (targets) alike
        while True:
            starts = torch.randint(len(data) - args.block - 1, (micro_batch,), generator=batches)
            x = torch.stack([data[s : s + args.block] for s in starts])
            yield x, torch.stack([data[s + 1 : s + 1 + args.block] for s in starts])

    stream = micro_batches()
    for step in range(args.steps):
        loss = engine.train_batch(stream)
        if dist.get_rank() == 0 and (step % 20 == 0 or step == args.steps - 1):
            say(f"[train_gpt] step {step} loss {loss.item():.4f}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepspeed_config", default=str(HERE / "ds_config.json"))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--block", type=int, default=64, help="context length")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--pipeline", action="store_true", help="train as pipeline stages")
    parser.add_argument("--stages", type=int, default=2, help="pipeline stages (--pipeline)")
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    from zeroscope.engine import api as deepspeed  # the bundled, DeepSpeed-shaped engine

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()

    text = (HERE / "tiny_corpus.txt").read_text()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(ch) for ch in text], dtype=torch.long)

    if args.pipeline:
        train_pipeline(args, data, len(chars))
        end_process_group()
        return

    torch.manual_seed(args.seed)  # the same initial weights on every rank
    model = TinyGPT(len(chars), args.block, args.width, args.layers, args.heads)
    engine, _optimizer, _loader, _scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=args.deepspeed_config
    )
    device = getattr(engine, "device", torch.device("cpu"))
    micro_batch = getattr(engine, "train_micro_batch_size_per_gpu", lambda: 8)()
    batches = torch.Generator().manual_seed(args.seed + 1 + rank)

    for step in range(args.steps):
        starts = torch.randint(len(data) - args.block - 1, (micro_batch,), generator=batches)
        x = torch.stack([data[s : s + args.block] for s in starts]).to(device)
        y = torch.stack([data[s + 1 : s + 1 + args.block] for s in starts]).to(device)
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        if rank == 0 and (step % 20 == 0 or step == args.steps - 1):
            say(f"[train_gpt] step {step} loss {loss.item():.4f}")

    end_process_group()


if __name__ == "__main__":
    main()
