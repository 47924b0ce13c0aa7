"""The loss a step shows is the loss the script logs when it accumulates gradients over k
micro-batches and hands ``backward()`` each loss divided by k (the common manual pattern, and
what ``accelerate``'s ``Accelerator.backward`` does): before, zeroscope showed a k-th of it (a
new user's accelerate run: 1.3887 shown for a logged 5.5546 at k = 4). Oracles: the script's
own micro-batch losses, averaged per step by the test; a loop that does not divide, and a loss
whose definition divides with no accumulation, are shown as before."""

from __future__ import annotations

import os
import statistics

import pytest
import torch
import torch.distributed as dist

STEPS = 3


def _accumulate(rank: int, world: int, collector: str, k: int, how: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION

    install.install()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shown: list[float] = []
    logged: list[list[float]] = []
    end = SESSION.tel.step_end  # the agent's report path, where the step's loss is handed over

    def step_end(**figures: object) -> None:
        shown.append(float(figures["loss"]))  # type: ignore[arg-type]
        end(**figures)

    SESSION.tel.step_end = step_end
    for _ in range(STEPS):
        logged.append([])
        for _ in range(k):
            x, y = torch.randn(4, 8), torch.randn(4, 1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            if how == "halved":  # part of the loss's definition, no accumulation
                loss = loss / 2
            logged[-1].append(loss.item())
            (loss / k if how == "divided" else loss).backward()
        opt.step()
        opt.zero_grad()
    return {"shown": shown, "logged": logged}


@pytest.mark.parametrize(
    ("k", "how"), [(4, "divided"), (3, "divided"), (4, "summed"), (1, "halved")]
)
def test_the_step_shows_the_loss_the_script_logs(k: int, how: str) -> None:
    from tests.distributed import run_ranks, sink_collector

    collector = sink_collector()
    (r,) = run_ranks(_accumulate, 1, collector, k, how, timeout=120)
    assert len(r["shown"]) == STEPS
    for shown, logged in zip(r["shown"], r["logged"], strict=True):
        assert shown == pytest.approx(statistics.fmean(logged), rel=1e-6)
