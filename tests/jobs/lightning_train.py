"""An unmodified PyTorch Lightning job (``Trainer(strategy="ddp")`` on CPU ranks, launched by
torchrun or ``zeroscope run``): a tiny language model fed tuple batches ``(ids, labels)``, its
optimizer stepped by Lightning's automatic optimization. With ``--accum K`` Lightning runs
``training_step`` and ``backward`` itself for the first K-1 micro-batches of each step, under
DDP's ``no_sync``, and hands the last one to ``optimizer.step(closure=...)``, dividing every
micro-batch's loss by K before its backward.

Each rank writes to ``--out``.RANK its own account, per optimizer step: the micro-batch losses
``training_step`` returned (as float hex, undivided), and the tokens its batches held; and the
step count Lightning reached (``trainer.global_step``)."""

from __future__ import annotations

import argparse
import json

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.jobs.teardown import end_process_group

VOCAB, SEQ, BATCH = 64, 8, 4


class TinyLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, 32)
        self.head = torch.nn.Linear(32, VOCAB)
        self.account: dict[int, list[str]] = {}
        self.tokens: dict[int, int] = {}

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        ids, labels = batch
        logits = self.head(torch.nn.functional.gelu(self.embed(ids)))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        step = self.trainer.global_step + 1  # the optimizer step this micro-batch belongs to
        self.account.setdefault(step, []).append(float(loss.detach()).hex())
        self.tokens[step] = self.tokens.get(step, 0) + ids.numel()
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (256, SEQ), generator=g)
    data = DataLoader(TensorDataset(ids, (ids * 7 + 3) % VOCAB), batch_size=BATCH)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=args.steps,
        accumulate_grad_batches=args.accum,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = TinyLM()
    trainer.fit(model, data)
    steps = sorted(model.account)
    with open(f"{args.out}.{trainer.global_rank}", "w") as f:
        json.dump(
            {
                "steps": trainer.global_step,
                "losses": [model.account[s] for s in steps],
                "tokens": [model.tokens[s] for s in steps],
            },
            f,
        )
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
