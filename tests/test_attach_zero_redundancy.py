"""torch's own ZeRO-1, ``torch.distributed.optim.ZeroRedundancyOptimizer``, under the attach:
O is this rank's shard of the optimizer state, and the Hello says ZeRO-1. The wrapper keeps
no state of its own (its local optimizer, ``optim``, holds the shard), so before, a DDP job with
it showed O 0 B at every step and a ZeRO-0 prediction of the whole state on every rank.

Oracles: a one-process AdamW over the same model (the ranks' O add up to its state's bytes),
and the formula over the shard ZeRO gave each rank (AdamW's two fp32 moments per element and a
4-byte step counter per parameter), for a DDP job and a loop without DDP, 2 gloo ranks."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

STEPS = 3


def _net() -> torch.nn.Module:
    # Layers of unequal sizes: ZeRO's greedy partition gives the ranks unequal shards.
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 96), torch.nn.Linear(96, 8)
    )


def _zero(rank: int, world: int, collector: str, wrap: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION

    install.install()
    dist.init_process_group("gloo")
    net = _net()
    model = torch.nn.parallel.DistributedDataParallel(net) if wrap == "ddp" else net
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3)
    optim: list[int | None] = []
    configs: list[object] = []
    SESSION._start()  # a loop without DDP starts the agent at its first step: wrap it first
    tel = SESSION.tel
    step_end, hello = tel.step_end, tel.hello

    def on_step_end(**figures: object) -> None:
        optim.append(figures["memory"].optim)  # type: ignore[attr-defined]
        step_end(**figures)

    def on_hello(**kwargs: object) -> None:
        configs.append(kwargs["config"])
        hello(**kwargs)

    tel.step_end, tel.hello = on_step_end, on_hello
    torch.manual_seed(1 + rank)
    for _ in range(STEPS):
        model(torch.randn(16, 64)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    shard = [p for group in opt.optim.param_groups for p in group["params"]]
    c = configs[-1]
    return {
        "optim": optim,
        "shard_elements": sum(p.numel() for p in shard),
        "shard_params": len(shard),
        "config": (
            c.stage,  # type: ignore[attr-defined]
            c.dp_world_size,  # type: ignore[attr-defined]
            c.optimizer,  # type: ignore[attr-defined]
            c.optimizer_slots,  # type: ignore[attr-defined]
            c.grads_all_reduced,  # type: ignore[attr-defined]
        ),
    }


def _one_process_adamw_state_bytes() -> int:
    net = _net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    net(torch.randn(16, 64)).pow(2).mean().backward()
    opt.step()
    return sum(
        t.untyped_storage().nbytes()
        for state in opt.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )


@pytest.mark.parametrize("wrap", ["ddp", "plain"])
def test_o_is_each_ranks_shard_and_the_hello_says_zero_1(wrap: str) -> None:
    from tests.distributed import run_ranks, sink_collector

    ranks = run_ranks(_zero, 2, sink_collector(), wrap, timeout=120)
    whole = _one_process_adamw_state_bytes()
    for r in ranks:
        assert len(r["optim"]) == STEPS
        # Every step's report, from the first (its optimizer step made the state): the shard.
        assert set(r["optim"]) == {8 * r["shard_elements"] + 4 * r["shard_params"]}
        assert r["config"][:2] == (1, 2)
        assert r["config"][2:4] == ("ZeroRedundancyOptimizer(AdamW)", 2)
        assert r["config"][4] is (wrap == "ddp")  # DDP's reducer all-reduces the gradients
    assert sum(r["optim"][-1] for r in ranks) == whole
    assert 0 < min(r["optim"][-1] for r in ranks) < whole / 2 < max(r["optim"][-1] for r in ranks)
