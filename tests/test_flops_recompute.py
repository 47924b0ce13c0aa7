"""A step's model FLOPs leave out the forward that activation checkpointing runs again in the
backward (MFU counts the model's FLOPs; the recompute is hardware FLOPs): a checkpointed model
counts what the same model counts without checkpointing, and both equal torch's own
``FlopCounterMode`` on the model without it. A ``create_graph`` backward (a gradient penalty)
runs its ops with grad mode on too; those are the backward's own and stay counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from agent.flops import StepFlops


class Stack(torch.nn.Module):
    """An input layer, then blocks that may run under a checkpoint function, then a head."""

    def __init__(self, run: Callable[..., Any] | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(32, 64)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
            for _ in range(3)
        )
        self.head = torch.nn.Linear(64, 16)
        self.run = run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + (block(h) if self.run is None else self.run(block, h))
        return self.head(h)


def _step(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).square().mean().backward()


def _counted(model: torch.nn.Module, x: torch.Tensor) -> StepFlops:
    counter = StepFlops()
    with counter:
        _step(model, x)
    return counter


def _torch_count(model: torch.nn.Module, x: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as mode:
        _step(model, x)
    return int(mode.get_total_flops())


def test_autograds_graph_task_is_there_to_read() -> None:
    """The private call the split rests on: gone in a torch upgrade, this fails loudly."""
    assert torch._C._current_graph_task_id() == -1


@pytest.mark.parametrize(
    "run",
    [
        lambda f, h: checkpoint(f, h, use_reentrant=True),
        lambda f, h: checkpoint(f, h, use_reentrant=False),
    ],
    ids=["reentrant", "non-reentrant"],
)
def test_a_checkpointed_model_counts_the_models_flops(run: Callable[..., Any]) -> None:
    x = torch.randn(8, 32)
    plain = _torch_count(Stack(), x)
    counter = _counted(Stack(run), x)
    assert counter.total == plain == _counted(Stack(), x).total
    assert counter.recomputed > 0 and counter.counted == plain + counter.recomputed


def test_the_bundled_engines_checkpoint_too() -> None:
    from zeroscope.engine.checkpointing import checkpoint as engine_checkpoint

    x = torch.randn(8, 32)
    counter = _counted(Stack(lambda f, h: engine_checkpoint(f, h)), x)
    assert counter.recomputed > 0
    assert counter.total == _torch_count(Stack(), x)


def test_a_create_graph_backward_stays_counted() -> None:
    """A gradient penalty: the first backward, with ``create_graph``, runs every op with grad
    mode on; nothing of it is a recompute."""
    model, x = Stack(), torch.randn(8, 32)

    def penalty_step() -> None:
        loss = model(x).square().mean()
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        (loss + sum(g.square().sum() for g in grads)).backward()

    counter = StepFlops()
    with counter:
        penalty_step()
    with FlopCounterMode(display=False) as mode:
        penalty_step()
    assert counter.recomputed == 0
    assert counter.total == mode.get_total_flops() > 0


@pytest.mark.parametrize("reentrant", [True, False])
def test_hf_gradient_checkpointing_counts_the_models_flops(reentrant: bool) -> None:
    """The common case: a Hugging Face model with ``gradient_checkpointing_enable()``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    def gpt2(checkpointed: bool) -> GPT2LMHeadModel:
        torch.manual_seed(0)
        config = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=3, n_head=4)
        model = GPT2LMHeadModel(config).train()
        if checkpointed:
            model.gradient_checkpointing_enable({"use_reentrant": reentrant})
        return model

    ids = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1))

    def step(model: GPT2LMHeadModel) -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    counters = []
    for checkpointed in (True, False):
        counter = StepFlops()
        with counter:
            step(gpt2(checkpointed))
        counters.append(counter)
    with FlopCounterMode(display=False) as mode:
        step(gpt2(False))
    with_checkpoints, without = counters
    assert with_checkpoints.recomputed > 0  # it did run the blocks' forwards again
    assert with_checkpoints.total == without.total == mode.get_total_flops()
