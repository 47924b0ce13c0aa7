"""An unmodified script in the shape of accelerate's ``examples/by_feature/gradient_accumulation.py``
(2 CPU ranks under torchrun, ``Accelerator(cpu=True)``, as ``accelerate launch --cpu`` gives:
accelerate builds DDP over gloo):
``Accelerator(gradient_accumulation_steps=K)``, ``with accelerator.accumulate(model)`` around
every micro-batch, and ``optimizer.step()`` / ``scheduler.step()`` / ``zero_grad()`` called on
each of them. accelerate's wrappers make the real optimizer step only where the gradients sync
(every K-th micro-batch, DDP's ``no_sync()`` on the others), and ``accelerator.backward``
divides each loss by K before its backward.

Each rank writes to ``--out``.RANK its own account, per real optimizer step: its micro-batch
losses (``float.hex``, as returned by the model, undivided), the tokens its micro-batches held,
and accelerate's ``sync_gradients`` on each micro-batch."""

import argparse
import json

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.jobs.teardown import end_process_group

SEQ, BATCH, VOCAB = 16, 4, 64


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    accelerator = Accelerator(
        cpu=True, gradient_accumulation_steps=args.accum, mixed_precision=args.mixed_precision
    )
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Flatten(), nn.Linear(32 * SEQ, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)
    micro = args.steps * args.accum
    data = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2 * BATCH * micro, SEQ), generator=data)
    labels = torch.randint(0, VOCAB, (2 * BATCH * micro,), generator=data)
    loader = DataLoader(TensorDataset(ids, labels), batch_size=BATCH)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    steps: list[dict] = []
    losses: list[str] = []
    tokens = 0
    syncs: list[bool] = []
    for index, (x, y) in enumerate(loader, start=1):
        if index > micro:
            break
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
        losses.append(loss.item().hex())
        tokens += x.numel()
        syncs.append(accelerator.sync_gradients)
        if accelerator.sync_gradients:
            steps.append({"losses": losses, "tokens": tokens, "syncs": syncs})
            losses, tokens, syncs = [], 0, []
    own = {
        "steps": steps,
        "distributed": str(accelerator.distributed_type),
        "world": accelerator.num_processes,
        "params": sum(p.numel() for p in model.parameters()),
    }
    with open(f"{args.out}.{accelerator.process_index}", "w") as f:
        json.dump(own, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
