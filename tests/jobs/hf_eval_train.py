"""A Hugging Face ``Trainer`` on DDP (no DeepSpeed) that evaluates every few steps
(``eval_strategy="steps"``), with nothing of zeroscope in it: a tiny GPT-2 built from a config.

Per rank it writes to ``--out``.RANK its own clock around each evaluation, from callbacks
(``time.perf_counter``): the end of the step before it (``on_step_end``), its first batch
(``on_prediction_step``), its end (``on_evaluate``) and the next step's begin
(``on_step_begin``); and DDP's own bucket sizes in bytes (its logging data), what each step's
backward all-reduces.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from tests.jobs.hf_trainer_train import Tokens
from tests.jobs.teardown import end_process_group


class EvalClock(TrainerCallback):
    """The job's own clock around each evaluation."""

    def __init__(self) -> None:
        self.evals: list[dict[str, float]] = []
        self.step_end = 0.0
        self.open: dict[str, float] | None = None

    def on_step_end(self, args, state, control, **kwargs):
        self.step_end = time.perf_counter()

    def on_prediction_step(self, args, state, control, **kwargs):
        if self.open is None:
            self.open = {"step": state.global_step, "after_step_end": self.step_end}
            self.open["first_batch_done"] = time.perf_counter()

    def on_evaluate(self, args, state, control, **kwargs):
        if self.open is not None:
            self.open["evaluated"] = time.perf_counter()

    def on_step_begin(self, args, state, control, **kwargs):
        if self.open is not None:
            self.open["next_step_begin"] = time.perf_counter()
            self.evals.append(self.open)
            self.open = None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--eval-steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    training = TrainingArguments(
        output_dir=args.workdir,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        max_steps=args.steps,
        eval_strategy="steps",
        eval_steps=args.eval_steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    clock = EvalClock()
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=Tokens(64),
        eval_dataset=Tokens(400),  # 100 batches a rank: a gather each, most of the ring
        callbacks=[clock],
    )
    trainer.train()
    data = trainer.model_wrapped._get_ddp_logging_data()
    key = "rebuilt_bucket_sizes" if data.get("has_rebuilt_buckets") else "bucket_sizes"
    out = {"evals": clock.evals, "bucket_bytes": [int(x) for x in str(data[key]).split(",")]}
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(out, f)
    end_process_group()


if __name__ == "__main__":
    main()
