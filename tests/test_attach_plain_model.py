"""A plain loop's model, found at its optimizer's first step (agent/attach/plain_model.py): from
the next step on its forward is timed (phases, activations, the model's inputs) and its frozen
parameters are in P. Before, a single-process loop showed no forward phase, A NA and "no
model forward seen", and a LoRA-style loop's P left out the frozen base.

Oracles: the phases' raw marks per iteration, the model's own parameter counts (frozen and
trainable), the same loop without the attach (losses, bit for bit); a second instance of the
model's class (an EMA copy) and a compiled model are left untimed."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import torch

from zeroscope.agent.attach.plain_model import COMPILED, FOUND_NOW

ITERATIONS = 4


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Linear(8, 32)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.embed(x)))


class Trainer:
    """A script's own trainer class: the model is an attribute, not a local of step()'s caller."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=1e-3)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()
        marks = _marks()
        self.opt.step()
        self.opt.zero_grad()
        self.marks.append(marks)
        return loss.item()

    marks: list[list[str]]


def _marks() -> list[str]:
    from zeroscope.agent.attach.session import SESSION

    tel = SESSION.tel
    return [] if tel is None else [scope.name for scope, _, _ in getattr(tel, "_marks", [])]


def _loop(rank: int, world: int, collector: str, how: str, attach: bool) -> dict[str, Any]:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    if attach:
        from zeroscope.agent.attach import install

        install.install()
    import torch.distributed  # the attach installs once torch.distributed is in

    from zeroscope.agent.attach.session import SESSION

    model: torch.nn.Module = Net()
    if how == "frozen":
        model.embed.requires_grad_(False)
    if how == "compiled":
        model = torch.compile(model, backend="eager")
    ema = copy.deepcopy(model) if how == "ema" else None
    trainer = Trainer(model)
    trainer.marks = []
    memories: list[Any] = []
    works: list[Any] = []  # each step's (positions, why) as the agent's meter took them
    if attach:
        SESSION._start()
        meter = SESSION.tel.work
        take = meter.take

        def take_(step: int) -> Any:
            facts = take(step)
            works.append(None if facts is None else (facts[0], facts[4]))
            return facts

        meter.take = take_
        end = SESSION.tel.step_end

        def step_end(**figures: Any) -> None:
            end(**figures)
            counted = SESSION.tel._last_activations  # (bytes, step): the agent's own count
            memories.append((figures["memory"], counted))

        SESSION.tel.step_end = step_end
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(ITERATIONS):
        x, y = torch.randn(16, 8, generator=data), torch.randn(16, 1, generator=data)
        losses.append(trainer.step(x, y).hex())
        if ema is not None:
            with torch.no_grad():
                ema(x)  # another instance of the class: not the model's forward
    return {
        "losses": losses,
        "marks": trainer.marks,
        "params": [(m.params, m.frozen_params, a and a[0]) for m, a in memories],
        "found": SESSION.model is not None and SESSION.model() is model,
        "works": works,
        "errors": SESSION.errors,
    }


@pytest.mark.parametrize("how", ["plain", "frozen", "ema"])
def test_the_loops_model_is_found_and_its_forward_timed_from_the_second_step(how: str) -> None:
    from tests.distributed import run_ranks, sink_collector

    collector = sink_collector()
    (plain,) = run_ranks(_loop, 1, collector, how, False, timeout=120)
    (r,) = run_ranks(_loop, 1, collector, how, True, timeout=120)
    assert r["losses"] == plain["losses"]
    assert r["found"] and r["errors"] == 0
    timed = ["forward", "forward", "backward", "backward"]
    # Step 1 ends where the model is found: its forward ran unwatched; then once per step.
    assert r["marks"] == [[]] + [timed] * (ITERATIONS - 1)
    # Step 1's tokens and FLOPs are NA saying why (they were NA with no reason); from step 2
    # the model's inputs are seen (a [16, 8] input is no batch of sequences: that is said).
    works = r["works"]
    assert works[0] == (None, FOUND_NOW), works
    assert all(w is not None and w[1] != FOUND_NOW and "sequences" in w[1] for w in works[1:])
    net = Net()
    every = 4 * sum(p.numel() for p in net.parameters())
    frozen = 4 * sum(p.numel() for p in net.embed.parameters()) if how == "frozen" else 0
    params = r["params"]
    assert len(params) == ITERATIONS
    # From step 2 the census knows the model: P holds every parameter, the frozen ones too.
    assert all(p == every and f == frozen for p, f, _ in params[1:]), params
    assert all(a for _, _, a in params[1:3]), params  # A counted on the first steps


def test_a_compiled_model_is_left_alone() -> None:
    """Wrapping a compiled model's class after Dynamo compiled it would recompile it: its
    forward stays untimed (as before) and the job trains the same."""
    from tests.distributed import run_ranks, sink_collector

    collector = sink_collector()
    (plain,) = run_ranks(_loop, 1, collector, "compiled", False, timeout=300)
    (r,) = run_ranks(_loop, 1, collector, "compiled", True, timeout=300)
    assert r["losses"] == plain["losses"]
    assert not r["found"] and r["errors"] == 0
    assert all("forward" not in marks for marks in r["marks"])
    assert r["works"] == [(None, COMPILED)] * ITERATIONS  # NA with the reason, every step
