"""A Hugging Face ``Trainer`` job on one device, as a single-GPU fine-tune is written: no
DeepSpeed, no DDP (the Trainer wraps nothing), an HF Llama built from a config, token ids with
right padding through an attention mask, ``ACCUMULATION`` micro-batches an optimizer step.

Started by torchrun, each rank is a job of its own: on CPU the Trainer does not form a
process group under torchrun, and the script says what it ran as (``parallel_mode``), so a
Trainer that did go distributed is seen. Per rank it writes to ``--out``.RANK each
micro-batch's loss (the exact float, hex) and each optimizer step's tokens (the masks' sums the
Trainer fed the model, counted here).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from tests.jobs.throughput_train import ACCUMULATION, MICRO, SEQ, VOCAB, llama


class Padded(torch.utils.data.Dataset):
    """Sequences of ``SEQ`` ids, each with its own right padding (labels -100 there)."""

    def __init__(self, rank: int, size: int = 64) -> None:
        data = torch.Generator().manual_seed(rank)
        self.ids = torch.randint(0, VOCAB, (size, SEQ), generator=data)
        self.lengths = torch.randint(SEQ // 2, SEQ + 1, (size,), generator=data)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = (torch.arange(SEQ) < self.lengths[i]).long()
        ids = self.ids[i]
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": ids.masked_fill(mask == 0, -100),
        }


class Recording(Trainer):
    """The Trainer, its ``compute_loss`` noting each micro-batch's loss and tokens."""

    losses: list[str]
    tokens: list[int]

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        self.losses.append(float(loss.detach()).hex())
        self.tokens.append(int(inputs["attention_mask"].sum()))
        return loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    training = TrainingArguments(
        output_dir=f"{args.out}-trainer.{rank}",
        max_steps=args.steps,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=False,
        seed=0,
    )
    trainer = Recording(model=llama(), args=training, train_dataset=Padded(rank))
    trainer.losses, trainer.tokens = [], []
    trainer.train()
    tokens = trainer.tokens
    steps = [sum(tokens[i : i + ACCUMULATION]) for i in range(0, len(tokens), ACCUMULATION)]
    with open(f"{args.out}.{rank}", "w") as f:
        said = {"parallel_mode": str(training.parallel_mode.value), "world": training.world_size}
        json.dump({"losses": trainer.losses, "tokens": steps, **said}, f)


if __name__ == "__main__":
    main()
