"""A LoRA fine-tune with nothing of zeroscope in it: PEFT's LoRA (q_proj, v_proj) on a tiny
Llama built from a config, trained a few steps by FSDP2, by DeepSpeed (each ds_config given,
one after the other, in one process) or by both: FSDP2 first, then each ds_config, in one
process (one launch instead of two: a launch's cost is its ranks' start-up, not training).
FSDP2 goes first because a step source, once DeepSpeed's engine claimed it, stays DeepSpeed's
for the rest of the process (agent/attach/session.py): a plain optimizer's steps after it are
not counted as steps.

Per rank it writes the losses (exact floats, hex) and what the rank's model is made of, as the
model itself says: each parameter's element count and whether it is trainable, in the
module's order, and the bytes per element it trains in. The frozen-parameter tests compute
from those, with each engine's partitioning rules, the bytes the rank holds.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
import torch.distributed as dist

from tests.jobs.teardown import end_process_group

VOCAB, HIDDEN, SEQ = 64, 32, 8


def build_model() -> torch.nn.Module:
    """Tiny Llama + LoRA r=4 on q and v. Every size is a multiple of 4 (2 x the 2 ranks), so no
    engine pads: measured bytes can equal the ZeRO formulas exactly."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    base = LlamaForCausalLM(config)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    model = get_peft_model(base, lora)
    # PEFT initialises B to zeros (the update starts at 0); make it non-zero so the adapters'
    # gradients reach A from the first step.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.02)
    return model


def describe(model: torch.nn.Module) -> list[list[int]]:
    """[numel, trainable] per parameter, in the module's order (before any engine touches it)."""
    return [[p.numel(), int(p.requires_grad)] for p in model.parameters()]


def batches(steps: int, micro: int) -> list[torch.Tensor]:
    data = torch.Generator().manual_seed(1000 + dist.get_rank())
    return [torch.randint(0, VOCAB, (micro, SEQ), generator=data) for _ in range(steps)]


def train_deepspeed(config_path: str, steps: int) -> dict[str, Any]:
    import deepspeed

    with open(config_path) as f:
        config = json.load(f)
    model = build_model()
    record: dict[str, Any] = {"params": describe(model), "losses": []}
    engine, *_ = deepspeed.initialize(
        model=model,
        config=config,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
    )
    record["element_size"] = 2 if engine.bfloat16_enabled() else 4
    for ids in batches(steps, engine.train_micro_batch_size_per_gpu()):
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        record["losses"].append(loss.item().hex())
    engine.destroy()
    return record


def train_fsdp2(steps: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    model = build_model()
    record: dict[str, Any] = {"params": describe(model), "losses": [], "element_size": 4}
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for ids in batches(steps, 4):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        record["losses"].append(loss.item().hex())
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", help="comma-separated ds_config paths (DeepSpeed)")
    parser.add_argument(
        "--fsdp2", action="store_true", help="train with FSDP2 (first, before any --configs)"
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", required=True, help="JSON file prefix (.RANK is appended)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.configs:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
    else:
        dist.init_process_group("gloo")
    results = {"fsdp2": train_fsdp2(args.steps)} if args.fsdp2 else {}
    for path in args.configs.split(",") if args.configs else []:
        results[path] = train_deepspeed(path, args.steps)
    with open(f"{args.out}.{dist.get_rank()}", "w") as f:
        json.dump(results, f)
    end_process_group()  # a barrier kept past torch's gloo teardown abort


if __name__ == "__main__":
    main()
