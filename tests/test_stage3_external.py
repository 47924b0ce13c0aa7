"""Stage 3, a parameter read outside its own module's forward: a read for metadata alone
(``x.to(self.blocks[0].up.weight.dtype)``) gathers nothing and registers nothing, so ranks that
run their blocks in different orders still pair their all-gathers; a read whose data is used (a
weight multiplied in the parent's forward) is gathered at that use and registered to the module
running, and trains like one-process torch."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.distributed import run_ranks
from zeroscope.engine.api import initialize

CONFIG: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
    },
}


class Reader(nn.Module):
    """Linear blocks; the root reads the first block's weight: its dtype and device only, or
    (``use``) its data too, multiplied in the root's own forward. ``reverse`` runs the blocks
    last to first (same sizes, other parameters)."""

    def __init__(self, use: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
        self.use = use
        self.reverse = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = self.blocks[0].weight
        x = x.to(dtype=first.dtype, device=first.device)
        for block in reversed(self.blocks) if self.reverse else self.blocks:
            x = torch.tanh(block(x))
        if self.use:
            x = x @ first.t()
        return (x**2).mean()


def _train(model: nn.Module, steps: int, reverse_at: int = -1) -> tuple[Any, list[float]]:
    engine, *_ = initialize(model=model, config=CONFIG)
    data = torch.Generator().manual_seed(1)
    losses = []
    for step in range(steps):
        model.reverse = step == reverse_at  # type: ignore[assignment]
        loss = engine(torch.randn(2, 6, generator=data))
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    return engine, losses


def _reference(use: bool, steps: int) -> list[float]:
    torch.manual_seed(0)
    model = Reader(use)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        loss = model(torch.randn(2, 6, generator=data))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def test_metadata_read_gathers_nothing_and_registers_nothing() -> None:
    """DeepSpeed's getter gathers here and registers the weight to the root."""
    torch.manual_seed(0)
    model = Reader(use=False)
    engine, losses = _train(model, 4)
    assert engine.strategy.coordinator.external == {}
    assert losses == pytest.approx(_reference(False, 4), rel=1e-5)


def test_data_read_is_gathered_registered_and_trained_like_torch() -> None:
    """Without the gather the root multiplies an empty placeholder: "size mismatch"."""
    torch.manual_seed(0)
    model = Reader(use=True)
    engine, losses = _train(model, 4)
    coordinator = engine.strategy.coordinator
    weight = coordinator.partition.by_param[model.blocks[0].weight]
    assert coordinator.external == {model: [weight]}
    assert model.blocks[0].weight.numel() == 0  # released after use like the root's own
    assert losses == pytest.approx(_reference(True, 4), rel=1e-5)


def _ranks_in_other_orders(rank: int, world: int) -> list[float]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    return _train(Reader(use=False), 4, reverse_at=2 if rank == 1 else -1)[1]


def test_ranks_running_blocks_in_other_orders_still_pair_their_gathers() -> None:
    """Had the dtype read gathered the first block's weight for the root, rank 0 would gather
    that block's bias alone at step 3 while rank 1 gathers the last block's weight and bias:
    gloo aborts ("... vs ... Received data size doesn't match expected size")."""
    losses = run_ranks(_ranks_in_other_orders, 2, timeout=120)
    assert [len(x) for x in losses] == [4, 4]
