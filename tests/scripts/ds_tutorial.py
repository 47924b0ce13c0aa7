"""A DeepSpeed tutorial-style training script (the shape of DeepSpeed's CIFAR / getting-started
examples): argparse with ``deepspeed.add_config_arguments``, ``deepspeed.init_distributed``,
``deepspeed.initialize(args=..., training_data=...)``, ``deepspeed.utils.RepeatingLoader``,
``save_checkpoint(client_state=...)`` and ``load_checkpoint``.

It imports ``deepspeed`` and nothing else of it; tests/test_tutorial_script.py runs it on real
DeepSpeed, with only that import changed to ``import zeroscope.engine as deepspeed``, and
unchanged under ``zeroscope run --as-deepspeed``. Rank 0 writes what it saw as JSON to --out.
"""

import argparse
import json

import deepspeed
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.fc2 = nn.Linear(32, 33)
        self.fc3 = nn.Linear(33, 3)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def train(engine, batches, steps):
    """``steps`` optimizer steps; the mean loss of each step's micro-batches."""
    losses = []
    for _ in range(steps):
        total = 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = next(batches)
            loss = F.mse_loss(engine(x.to(engine.device)), y.to(engine.device))
            engine.backward(loss)
            engine.step()
            total += loss.item()
        losses.append(total / engine.gradient_accumulation_steps())
    return losses


def main():
    parser = argparse.ArgumentParser(description="tutorial")
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()

    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(1)
    dataset = TensorDataset(torch.randn(96, 10, generator=g), torch.randn(96, 3, generator=g))
    engine, _optimizer, loader, _scheduler = deepspeed.initialize(
        args=args, model=model, model_parameters=model.parameters(), training_data=dataset
    )
    batches = iter(deepspeed.utils.RepeatingLoader(loader))
    first = train(engine, batches, args.steps)
    engine.save_checkpoint(args.checkpoint, client_state={"epoch": 7, "note": "tutorial"})
    tail = [next(batches) for _ in range(2 * engine.gradient_accumulation_steps())]
    after = train(engine, iter(tail), 2)
    path, client_state = engine.load_checkpoint(args.checkpoint)
    resumed = train(engine, iter(tail), 2)  # the same two steps again, from the checkpoint
    if deepspeed.comm.get_rank() == 0:
        result = {
            "first": first,
            "after": after,
            "resumed": resumed,
            "client_state": {k: client_state[k] for k in ("epoch", "note")},
            "loaded": path is not None,
            "global_steps": engine.global_steps,
            "global_samples": engine.global_samples,
            "lr": engine.get_lr(),
            "grad_norm": float(engine.get_global_grad_norm()),
            "batches_per_epoch": len(loader),
            "world": deepspeed.comm.get_world_size(),
        }
        with open(args.out, "w") as f:
            json.dump(result, f)
    # DeepSpeed's tutorials leave the process group to the interpreter, and torch 2.13's gloo
    # can then abort a finished rank at exit (tests/attach_support.py TEARDOWN_ABORT): twice in
    # a row in one CI run, past the one retry. The tests are about what the run computed.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
