"""The Memory screen's O for a torch optimizer: its parameter-sized state tensors per parameter
(agent/attach/optimizer_slots.py) from its class and settings, against torch's own state after
a step (the oracle), and the prediction a plain loop's Hello then gets. Before, every optimizer
was predicted as Adam: an SGD-with-momentum loop read O -50% (a user's trial)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from zeroscope.agent.attach.optimizer_slots import UNKNOWN, state_slots
from zeroscope.agent.schema import ConfigSummary, ParamCounts
from zeroscope.state import ClusterState
from zeroscope.state.prediction import predicted_memory

OPTIMIZERS: dict[str, Any] = {
    "SGD": lambda p: torch.optim.SGD(p, lr=0.1),
    "SGD momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "Adam": lambda p: torch.optim.Adam(p),
    "Adam amsgrad": lambda p: torch.optim.Adam(p, amsgrad=True),
    "AdamW": lambda p: torch.optim.AdamW(p),
    "Adamax": lambda p: torch.optim.Adamax(p),
    "NAdam": lambda p: torch.optim.NAdam(p),
    "RAdam": lambda p: torch.optim.RAdam(p),
    "Adadelta": lambda p: torch.optim.Adadelta(p),
    "Adagrad": lambda p: torch.optim.Adagrad(p),
    "RMSprop": lambda p: torch.optim.RMSprop(p),
    "RMSprop centered momentum": lambda p: torch.optim.RMSprop(p, momentum=0.9, centered=True),
    "Rprop": lambda p: torch.optim.Rprop(p),
}


def _stepped(make: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = make(model.parameters())
    model(torch.randn(5, 4)).pow(2).mean().backward()
    opt.step()
    return model, opt


def _param_sized(opt: torch.optim.Optimizer, p: torch.Tensor) -> list[torch.Tensor]:
    return [t for t in opt.state[p].values() if isinstance(t, torch.Tensor) and t.shape == p.shape]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_slots_are_torchs_own_parameter_sized_state(name: str) -> None:
    model, opt = _stepped(OPTIMIZERS[name])
    counts = {len(_param_sized(opt, p)) for p in model.parameters()}
    assert len(counts) == 1
    assert state_slots(opt) == counts.pop()


@pytest.mark.parametrize("name", ["SGD momentum", "Adagrad", "RMSprop centered momentum"])
def test_a_plain_loops_predicted_o_is_the_optimizers_state(name: str) -> None:
    model, opt = _stepped(OPTIMIZERS[name])
    held = sum(t.nbytes for p in model.parameters() for t in _param_sized(opt, p))
    t = sum(p.numel() for p in model.parameters())
    state = ClusterState()
    state.config = ConfigSummary(
        stage=0,
        precision="fp32",
        dp_world_size=2,
        optimizer=type(opt).__name__,
        no_master_copy=True,
        optimizer_slots=state_slots(opt),
    )
    state.params = ParamCounts(total=t, trainable=t)
    m, basis = predicted_memory(state)
    assert m is not None and m.optim == held
    assert f"O {type(opt).__name__} without a master copy" in basis


def test_an_unlisted_optimizer_or_mixed_groups_are_unknown() -> None:
    model = torch.nn.Linear(4, 3)
    assert state_slots(torch.optim.LBFGS(model.parameters())) == UNKNOWN
    mixed = torch.optim.SGD(
        [{"params": [model.weight], "momentum": 0.9}, {"params": [model.bias]}], lr=0.1
    )
    assert state_slots(mixed) == UNKNOWN
    assert state_slots(object()) == UNKNOWN
