"""A Hugging Face ``Trainer`` script over DDP (no DeepSpeed) with nothing of zeroscope in it,
run twice: ``--steps N`` trains and saves a checkpoint at step N; ``--resume`` then trains on
to ``--steps M`` from the newest checkpoint in ``--workdir`` (``resume_from_checkpoint=True``).

Per rank it writes the Trainer's own ``state.global_step`` at the end of each optimizer step,
and the learning rate it logged for the step, to ``--out``.RANK: the oracles for the step
numbers and the lr zeroscope reports.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.jobs.hf_trainer_train import Tokens, build_model
from tests.jobs.teardown import end_process_group


class GlobalSteps(TrainerCallback):
    def __init__(self) -> None:
        self.steps: list[int] = []
        self.lrs: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(int(state.global_step))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "learning_rate" in logs:  # the lr the step's update used, as logged
            self.lrs.append(float(logs["learning_rate"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
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
        save_strategy="steps",
        save_steps=args.steps,
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        ddp_backend="gloo",
    )
    steps = GlobalSteps()
    trainer = Trainer(
        model=build_model(), args=training, train_dataset=Tokens(64), callbacks=[steps]
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump({"global_steps": steps.steps, "lr": steps.lrs}, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
