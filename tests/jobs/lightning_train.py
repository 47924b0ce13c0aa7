"""An unmodified PyTorch Lightning job (``Trainer(strategy="ddp")`` on CPU ranks, launched by
torchrun or ``zeroscope run``): a tiny language model fed tuple batches ``(ids, labels)``, its
optimizer stepped by Lightning's automatic optimization. With ``--accum K`` Lightning runs
``training_step`` and ``backward`` itself for the first K-1 micro-batches of each step, under
DDP's ``no_sync``, and hands the last one to ``optimizer.step(closure=...)``, dividing every
micro-batch's loss by K before its backward.

With ``--fp16-scaler`` the Trainer runs Lightning's 16-mixed precision on the CPU (its
``MixedPrecision`` plugin handed a ``torch.amp.GradScaler("cpu")``, which Lightning does not
make on the CPU by itself): each micro-batch's divided loss goes to ``scaler.scale()``, the
closure runs outside ``optimizer.step()``, and ``scaler.step()`` / ``update()`` end the step.

Each rank writes to ``--out``.RANK its own account, per optimizer step: the micro-batch losses
``training_step`` returned (as float hex, undivided), the tokens its batches held and the
scaler's scale after the step's ``update()`` (None without a scaler); and the step count
Lightning reached (``trainer.global_step``)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
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
        self.scales: dict[int, float | None] = {}

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        ids, labels = batch
        logits = self.head(torch.nn.functional.gelu(self.embed(ids)))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        step = self.trainer.global_step + 1  # the optimizer step this micro-batch belongs to
        self.account.setdefault(step, []).append(float(loss.detach()).hex())
        self.tokens[step] = self.tokens.get(step, 0) + ids.numel()
        return loss

    def on_train_batch_end(self, outputs: object, batch: object, index: int) -> None:
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)
        step = self.trainer.global_step  # the step the last optimizer step made (or is making)
        self.scales[step] = scaler.get_scale() if scaler is not None else None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--fp16-scaler", action="store_true")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    plugins: list[Any] = []
    if args.fp16_scaler:  # a scale that grows every 2 clean steps, so the run shows it change
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
        plugins.append(MixedPrecision("16-mixed", "cpu", scaler=scaler))
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
        plugins=plugins,
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
                "scales": [model.scales.get(s) for s in steps],
            },
            f,
        )
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
