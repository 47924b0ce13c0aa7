"""A Hugging Face ``Trainer`` script with nothing of zeroscope in it: a tiny GPT-2 built from a
config (no download) trained with ``TrainingArguments(deepspeed=<ds_config>)``.

Per rank it writes the losses the Trainer logged, DeepSpeed's ``skipped_steps`` and
``global_steps``, and the parameter shapes to ``--out``.RANK.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from tests.jobs.teardown import end_process_group

SEQ = 16


def build_model() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=96, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2, tie_word_embeddings=True
    )
    return GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, 96, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepLosses(TrainerCallback):
    """The loss of every optimizer step, as the Trainer logs it (logging_steps=1)."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ds-config", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with open(args.ds_config) as f:
        ds_config = json.load(f)
    training = TrainingArguments(
        output_dir=args.workdir,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=ds_config.get("gradient_accumulation_steps", 1),
        max_steps=args.steps,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        deepspeed=ds_config,
        bf16=ds_config.get("bf16", {}).get("enabled") is True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    model = build_model()
    losses = StepLosses()
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(64), callbacks=[losses])
    trainer.train()
    engine = trainer.model_wrapped
    out = {
        "losses": losses.losses,
        "skipped_steps": int(engine.skipped_steps),
        "global_steps": int(engine.global_steps),
        # DeepSpeed's own grouping: the element count of each parameter, per flat group.
        "groups": [[p.numel() for p in g] for g in engine.optimizer.bit16_groups],
    }
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(out, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
