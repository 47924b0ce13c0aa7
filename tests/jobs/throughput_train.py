"""A plain PyTorch script with nothing of zeroscope in it, for the throughput figures of
attached jobs: an HF Llama built from a config under DDP (token ids with an attention mask
that pads some positions), the known-shape GPT of tests/throughput_support.py under FSDP2, and
an MLP on feature vectors under DDP (not a sequence model: tokens are NA), and the GPT again
under DeepSpeed ZeRO-3. Each optimizer step takes ``ACCUMULATION`` micro-batches.

Per mode and rank it writes each step's loss (the exact float, hex) and the tokens the step's
masks let through (their sum, counted here) to ``--out``.RANK.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from tests.jobs.teardown import end_process_group
from tests.throughput_support import KnownGPT

MICRO, SEQ, ACCUMULATION, VOCAB = 2, 16, 2, 64
LLAMA = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": SEQ,
}


def llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**LLAMA, attn_implementation="sdpa"))


def llama_dense_params() -> int:
    """N of the Llama config by hand: q and o h², k and v h·kv_width, the MLP 3·h·i per
    layer, the untied output layer V·h (embedding table and norms do no matmul)."""
    h, i = LLAMA["hidden_size"], LLAMA["intermediate_size"]
    kv = h // LLAMA["num_attention_heads"] * LLAMA["num_key_value_heads"]
    return (
        LLAMA["num_hidden_layers"] * (2 * h * h + 2 * h * kv + 3 * h * i) + LLAMA["vocab_size"] * h
    )


def train(mode: str, steps: int) -> dict:
    torch.manual_seed(0)
    if mode == "ddp-llama":
        model: torch.nn.Module = DistributedDataParallel(llama())
    elif mode == "fsdp2-gpt":
        model = KnownGPT(seq=SEQ)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif mode == "ds-zero3-gpt":
        return deepspeed_gpt(steps)
    else:
        model = DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(dist.get_rank())
    losses, tokens = [], []
    for step in range(steps):
        seen = 0
        for _ in range(ACCUMULATION):
            if mode == "mlp-ddp":
                x, y = torch.randn(MICRO, 24, generator=data), torch.randn(MICRO, 4, generator=data)
                loss = torch.nn.functional.mse_loss(model(x), y)
            else:
                ids = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=data)
                if mode == "ddp-llama":
                    mask = torch.ones(MICRO, SEQ, dtype=torch.long)
                    mask[0, SEQ - 3 - step :] = 0  # right padding, a different amount per step
                    labels = ids[:, :-1].masked_fill(mask == 0, -100)
                    loss = model(input_ids=ids[:, :-1], attention_mask=mask, labels=labels).loss
                    seen += int(mask.sum())
                else:
                    loss = model(ids[:, :-1], ids[:, 1:])
                    seen += MICRO * SEQ
            (loss / ACCUMULATION).backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
        tokens.append(seen)
    return {"losses": losses, "tokens": tokens}


def deepspeed_gpt(steps: int) -> dict:
    """The known-shape GPT under DeepSpeed ZeRO-3 (its hooks gather every parameter in
    forward and backward), the accumulation done by DeepSpeed's engine."""
    import deepspeed

    model = KnownGPT(seq=SEQ)
    config = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": ACCUMULATION,
        "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, config=config, model_parameters=model.parameters()
    )
    data = torch.Generator().manual_seed(dist.get_rank())
    losses, tokens = [], []
    for _ in range(steps * ACCUMULATION):
        ids = torch.randint(0, VOCAB, (MICRO, SEQ + 1), generator=data)
        loss = engine(ids[:, :-1], ids[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item().hex())
    tokens = [MICRO * SEQ * ACCUMULATION] * steps
    engine.destroy()
    return {"losses": losses, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="ddp-llama,fsdp2-gpt,mlp-ddp,ds-zero3-gpt")
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
