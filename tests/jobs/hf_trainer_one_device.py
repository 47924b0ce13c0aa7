"""A Hugging Face ``Trainer`` job on one device, as a single-GPU fine-tune is written: no
DeepSpeed, no DDP (the Trainer wraps nothing), an HF Llama built from a config, token ids with
right padding through an attention mask, ``ACCUMULATION`` micro-batches an optimizer step.

Started by torchrun, each rank is a job of its own: on CPU the Trainer does not form a
process group under torchrun, and the script says what it ran as (``parallel_mode``), so a
Trainer that did go distributed is seen. ``--trainers N`` trains N Trainers one after another
(each its own model, as a sweep script does). Per rank it writes to ``--out``.RANK, per
Trainer, each micro-batch's loss (the exact float, hex), each optimizer step's tokens (the
masks' sums the Trainer fed the model, counted here), its evaluations' losses (every 2
steps), and on its own clock how long step 1's micro-batches ran (the first one's start to the
last one's end) and ``train()`` took.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from tests.jobs.throughput_train import ACCUMULATION, MICRO, SEQ, VOCAB, llama


class Padded(torch.utils.data.Dataset):
    """Sequences of ``SEQ`` ids, each with its own right padding (labels -100 there)."""

    def __init__(self, seed: int, size: int = 64) -> None:
        data = torch.Generator().manual_seed(seed)
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
    """The Trainer, its ``compute_loss`` noting each training micro-batch's loss and tokens."""

    losses: list[str]
    tokens: list[int]
    spans: list[tuple[int, int]]
    """Each training micro-batch's (start, end) on the monotonic clock [ns]."""

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        out = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training:  # not an evaluation's (which asks for the outputs too)
            self.losses.append(float(out.detach()).hex())
            self.tokens.append(int(inputs["attention_mask"].sum()))
            self.spans.append((start, time.perf_counter_ns()))
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--trainers", type=int, default=1, help="Trainers run one after another")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    runs = [
        train(args.steps, rank, i, f"{args.out}-trainer{i}.{rank}") for i in range(args.trainers)
    ]
    with open(f"{args.out}.{rank}", "w") as f:
        json.dump(runs, f)


def train(steps: int, rank: int, index: int, folder: str) -> dict[str, Any]:
    """The ``index``-th Trainer's run (its own data): its losses, its steps' tokens, what it
    ran as."""
    training = TrainingArguments(
        output_dir=folder,
        max_steps=steps,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,  # each step's grad_norm, as the Trainer read it, in its log_history
        eval_strategy="steps",  # its dataloader is built after step 1: the model is wrapped
        eval_steps=2,
        disable_tqdm=True,
        dataloader_num_workers=0,
        bf16=False,
        seed=0,
    )
    data = Padded(100 * index + rank)
    trainer = Recording(model=llama(), args=training, train_dataset=data, eval_dataset=data)
    trainer.losses, trainer.tokens, trainer.spans = [], [], []
    t0 = time.perf_counter_ns()
    trainer.train()
    train_s = (time.perf_counter_ns() - t0) / 1e9
    tokens = trainer.tokens
    # Step 1's forwards ran from its first micro-batch's start to its last one's end.
    first = trainer.spans[:ACCUMULATION]
    forwards_s = (first[-1][1] - first[0][0]) / 1e9
    per_step = [sum(tokens[i : i + ACCUMULATION]) for i in range(0, len(tokens), ACCUMULATION)]
    said = {"parallel_mode": str(training.parallel_mode.value), "world": training.world_size}
    evaluations = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    figures = {"evaluations": evaluations, "step1_forwards_s": forwards_s, "train_s": train_s}
    figures["grad_norms"] = norms
    return {"losses": trainer.losses, "tokens": per_step, **figures, **said}


if __name__ == "__main__":
    main()
