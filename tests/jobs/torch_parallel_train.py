"""A plain PyTorch script with nothing of zeroscope in it: it trains the same small MLP with
DistributedDataParallel, then with FSDP2 (``fully_shard``), then with FSDP2 and
``CPUOffloadPolicy``, with a bf16 ``MixedPrecisionPolicy``, and with the layers not resharded
after forward, then with FSDP1 (``FullyShardedDataParallel``: ``FULL_SHARD`` with blocks wrapped
by hand, ``SHARD_GRAD_OP`` with an ``auto_wrap_policy``), one after the other in one process
(one launch for the engines ``--modes`` names).

Per mode and rank it writes each step's loss (the exact float, hex) and what the engine itself
says of its layout (DDP's bucket sizes, FSDP2's sharded shapes, FSDP1's flat shards) to
``--out``.RANK.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    ShardingStrategy,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP1
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.nn.parallel import DistributedDataParallel

from tests.jobs.teardown import end_process_group

IN, WIDTH, OUT = 32, 40, 3


def build_model() -> torch.nn.Sequential:
    """Three layers whose row counts do not divide by 2 everywhere (FSDP2 pads its shards)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, WIDTH),
        torch.nn.GELU(),
        torch.nn.Linear(WIDTH, 21),
        torch.nn.Linear(21, OUT),
    )


def wrap(mode: str, model: torch.nn.Sequential) -> tuple[torch.nn.Module, dict]:
    if mode == "ddp":
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.004)
        return ddp, {}
    if mode == "fsdp1":  # layers 0 and 2 wrapped by hand, the root holding layer 3
        cpu = torch.device("cpu")
        model[0], model[2] = FSDP1(model[0], device_id=cpu), FSDP1(model[2], device_id=cpu)
        root = FSDP1(model, device_id=cpu)
        return root, {"flat_shards": [p.numel() for p in root.parameters()]}
    if mode == "fsdp1-grad-op":  # every Linear its own unit, wrapped by the policy
        root = FSDP1(
            model,
            device_id=torch.device("cpu"),
            sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
            auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
        )
        return root, {"flat_shards": [p.numel() for p in root.parameters()]}
    kwargs: dict = {}
    if mode == "fsdp2-offload":
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if mode == "fsdp2-mp":  # bf16 compute and gathers, fp32 shards and reductions
        kwargs["mp_policy"] = MixedPrecisionPolicy(torch.bfloat16, torch.float32)
    layer_kwargs = {**kwargs, "reshard_after_forward": mode != "fsdp2-noreshard"}
    for layer in (model[0], model[2]):
        fully_shard(layer, **layer_kwargs)
    fully_shard(model, **kwargs)
    shapes = {name: list(p.to_local().shape) for name, p in model.named_parameters()}
    return model, {"local_shapes": shapes}


def train(mode: str, steps: int) -> dict:
    model, layout = wrap(mode, build_model())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(dist.get_rank())
    losses, norms = [], []
    for _ in range(steps):
        x = torch.randn(8, IN, generator=data)
        y = torch.randn(8, OUT, generator=data)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if mode.startswith("fsdp1"):  # FSDP1's own clipping: its norm all-reduced over the group
            norms.append(model.clip_grad_norm_(0.5).item().hex())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    logging_data = getattr(model, "_get_ddp_logging_data", None)  # gone in a drift test
    if mode == "ddp" and logging_data is not None:
        logged = logging_data()
        layout["bucket_sizes"] = [int(b) for b in logged["bucket_sizes"].split(", ")]
        layout["comm_hook"] = logged.get("comm_hook")  # DDP's own: None = its built-in one
    return {"losses": losses, "grad_norms": norms, **layout}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="ddp,fsdp2,fsdp2-offload")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results = {mode: train(mode, args.steps) for mode in args.modes.split(",")}
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(results, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
