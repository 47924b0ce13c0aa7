"""Builds one real engine of each kind the attach reads (FSDP2, DeepSpeed ZeRO-1/2/3) in one
process of world size 1 on gloo, with nothing of zeroscope in the loop, and prints as JSON, per
kind of object, the private attributes the attach relies on
(zeroscope.agent.attach.private_api) that the live object lacks: right after construction, and
after one training step (tests/test_attach_private_api.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

# Run without the repository on sys.path (as a user's script is): the teardown helper by path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from teardown import end_process_group

from zeroscope.agent.attach import private_api


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def step(forward, backward, optimizer_step) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(2, 8)
    loss = forward(x).float().square().mean()
    backward(loss)
    optimizer_step()


def fsdp2(out: dict) -> None:
    from torch.distributed.fsdp import fully_shard

    m = model()
    fully_shard(m[0])
    fully_shard(m)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    step(m, lambda loss: loss.backward(), opt.step)
    state = fully_shard.state(m)  # type: ignore[attr-defined]
    groups = state._fsdp_param_groups
    params = [fp for g in groups for fp in g.fsdp_params]
    from zeroscope.agent.attach.fsdp2 import FSDP2Reader

    reader = FSDP2Reader(state)
    out["fsdp2_reader"] = reader.private_missing()
    drifted = params[0]._sharded_param_data
    del params[0]._sharded_param_data  # as a release that renamed it would leave it
    out["fsdp2_reader_drifted"] = reader.private_missing()
    params[0]._sharded_param_data = drifted
    out["fsdp2"] = sorted(
        set(private_api.missing(state, "fsdp2.state"))
        | set(private_api.missing(state._state_ctx, "fsdp2.state_ctx"))
        | {n for g in groups for n in private_api.missing(g, "fsdp2.param_group")}
        | {n for p in params for n in private_api.missing(p, "fsdp2.param")}
    )


def deepspeed_stage(stage: int, out: dict) -> None:
    import deepspeed

    m = model()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, _, _, _ = deepspeed.initialize(model=m, config=config, model_parameters=m.parameters())
    zero = "deepspeed.zero3" if stage == 3 else "deepspeed.zero12"

    def gone() -> list[str]:
        names = set(private_api.missing(engine, "deepspeed.engine"))
        names |= set(private_api.missing(engine.optimizer, zero))
        for bucket in engine.optimizer.ipg_buckets.values():
            names |= set(private_api.missing(bucket, "deepspeed.ipg_bucket"))
        if stage == 3:
            for p in engine.module.parameters():
                names |= set(private_api.missing(p, "deepspeed.zero3_param"))
        return sorted(names)

    from zeroscope.agent.attach.deepspeed_engine import DeepSpeedReader

    built = gone()
    step(lambda x: engine(x.bfloat16()), engine.backward, engine.step)
    reader = DeepSpeedReader(engine)
    out[f"zero{stage}"] = {"built": built, "stepped": gone(), "reader": reader.private_missing()}
    name = "ipg_buckets"
    kept = getattr(engine.optimizer, name)
    delattr(engine.optimizer, name)  # as a release that renamed it would leave it
    out[f"zero{stage}"]["reader_drifted"] = reader.private_missing()
    setattr(engine.optimizer, name, kept)
    engine.destroy()


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out: dict = {"class_members": private_api.class_members()}
    fsdp2(out)
    for stage in (1, 2, 3):
        deepspeed_stage(stage, out)
    print("PROBE " + json.dumps(out))
    end_process_group()


if __name__ == "__main__":
    main()
