"""A DDP loop in the shape of nanoGPT's ``train.py``, the most copied DDP script: gradient
accumulation by setting ``model.require_backward_grad_sync`` by hand (no ``no_sync()``: only the
last micro-batch's backward all-reduces), each loss divided by the accumulation before
``scaler.scale(loss).backward()`` with a GradScaler that is off (fp32 and bf16: nanoGPT enables it
for fp16 only), ``scaler.unscale_``, gradient clipping, ``scaler.step`` / ``update``, and an
evaluation on rank 0 alone every few iterations (``model.eval()``, forwards under
``torch.no_grad()`` on the DDP model, ``model.train()``) before that iteration's micro-batches.

Each rank writes to ``--out``.RANK its own account per iteration: the micro-batch losses
(``float.hex``, undivided), the tokens of its batches, whether it evaluated first, the norm
``clip_grad_norm_`` returned; and the model's parameter count."""

import argparse
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from tests.jobs.teardown import end_process_group
from tests.throughput_support import KnownGPT

SEQ, BATCH, VOCAB = 16, 4, 64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=2)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(KnownGPT(vocab=VOCAB, seq=SEQ))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=False)  # nanoGPT: on for fp16 only
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    ctx = torch.autocast("cpu", dtype=dtype, enabled=args.bf16)
    data = torch.Generator().manual_seed(1 + rank)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=data)
        return ids[:, :-1], ids[:, 1:]

    iterations = []
    x, y = batch()
    for it in range(args.steps):
        evaluated = rank == 0 and it % args.eval_every == 0
        if evaluated:
            model.eval()
            with torch.no_grad(), ctx:
                for _ in range(2):
                    model(*batch())
            model.train()
        losses, tokens = [], 0
        for micro in range(args.accum):
            model.require_backward_grad_sync = micro == args.accum - 1
            with ctx:
                loss = model(x, y)
                losses.append(loss.item().hex())
                tokens += x.numel()
                loss = loss / args.accum
            x, y = batch()  # the next batch before the backward, as nanoGPT prefetches
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        own_step = {"losses": losses, "tokens": tokens, "evaluated": evaluated}
        iterations.append({**own_step, "grad_norm": norm.item().hex()})
    own = {"iterations": iterations, "params": sum(p.numel() for p in model.parameters())}
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(own, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
