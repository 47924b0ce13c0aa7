"""A Hugging Face ``Trainer`` script with nothing of zeroscope in it, compiled: the tiny GPT-2 of
tests/jobs/hf_trainer_train.py trained with ``TrainingArguments(torch_compile=True)`` (DDP
underneath on 2 ranks, ``aot_eager``).

Per rank it writes the losses the Trainer logged (``float.hex`` of each) and what Dynamo itself
counted (``torch._dynamo.utils.counters``: graph breaks, frames, graphs) to ``--out``.RANK.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.jobs.compiled_train import dynamo_counts
from tests.jobs.hf_trainer_train import Tokens, build_model
from tests.jobs.teardown import end_process_group


class StepLosses(TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[str] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]).hex())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    training = TrainingArguments(
        output_dir=args.workdir,
        per_device_train_batch_size=2,
        max_steps=args.steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        torch_compile=True,
        torch_compile_backend="aot_eager",
    )
    losses = StepLosses()
    trainer = Trainer(
        model=build_model(), args=training, train_dataset=Tokens(64), callbacks=[losses]
    )
    trainer.train()
    out = {"hf": {"losses": losses.losses, **dynamo_counts()}}
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(out, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
