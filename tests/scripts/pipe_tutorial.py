"""A DeepSpeed pipeline-parallel training script in the style of DeepSpeed's pipeline tutorial
(its layers as LayerSpecs and a lambda, ``train_batch()`` fed by ``training_data``). It runs on
real DeepSpeed as written; tests/test_pipe_deepspeed.py runs it a second time with only its
imports rewritten to the bundled engine and compares the losses.

    torchrun --nproc-per-node 2 pipe_tutorial.py --steps 4 --out losses.json
"""

import argparse
import json

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule
from torch import nn


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1138)
    parser.add_argument("--out", default="")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--zero", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bf16 stages, bf16 inputs")
    return parser.parse_args()


def dataset(n=96, features=12, classes=5, seed=7, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g).to(dtype)
    y = torch.randint(0, classes, (n,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


_HELD: list[object] = []


def main():
    args = get_args()
    deepspeed.init_distributed(dist_backend=args.backend)
    torch.manual_seed(args.seed)
    layers = [
        LayerSpec(nn.Linear, 12, 32),
        LayerSpec(nn.ReLU),
        LayerSpec(nn.Linear, 32, 32),
        lambda x: torch.tanh(x),
        LayerSpec(nn.Linear, 32, 16),
        LayerSpec(nn.ReLU),
        LayerSpec(nn.Linear, 16, 5),
    ]
    net = PipelineModule(
        layers=layers,
        loss_fn=torch.nn.CrossEntropyLoss(),
        num_stages=args.stages,
        partition_method="parameters",
        activation_checkpoint_interval=0,
    )
    config = {
        "train_batch_size": 8,
        "train_micro_batch_size_per_gpu": 2,
        "steps_per_print": 1000,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": 3e-3, "weight_decay": 0.0, "torch_adam": True},
        },
        "zero_optimization": {"stage": args.zero},
        "pipeline": {"seed_layers": False},
    }
    dtype = torch.float32
    if args.bf16:  # DeepSpeed's BF16_Optimizer; the pipeline feeds the first stage as given
        config["bf16"] = {"enabled": True}
        dtype = torch.bfloat16
    engine, _, _, _ = deepspeed.initialize(
        args=args,
        model=net,
        model_parameters=[p for p in net.parameters() if p.requires_grad],
        training_data=dataset(dtype=dtype),
        config=config,
    )
    losses = [float(engine.train_batch()) for _ in range(args.steps)]
    held_out = torch.utils.data.DataLoader(dataset(n=16, seed=8, dtype=dtype), batch_size=2)
    eval_loss = float(engine.eval_batch(data_iter=iter(held_out)))
    if args.out and engine.global_rank == 0:
        with open(args.out, "w") as f:
            parts = [int(p) for p in net.parts]
            json.dump({"losses": losses, "eval": eval_loss, "parts": parts}, f)
    # The end of tests/jobs/teardown.py (this script runs without the repository on its path):
    # a barrier whose Work is kept, past torch's gloo teardown abort (a CI run aborted rank 0).
    work = dist.barrier(async_op=True)
    work.wait()
    _HELD.append(work)


if __name__ == "__main__":
    main()
