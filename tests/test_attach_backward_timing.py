"""How the attach times backward: around ``Tensor.backward`` where the job calls it (no Python
hook inside autograd's engine, which costs a CPU job ~40-60 us a step even empty), and with a
``grad_fn`` pre-hook and a queued engine callback where it does not (a job calling
``torch.autograd.backward`` itself). Oracles: the phases' raw marks (one backward phase per
iteration, inside the forward-to-step window), which way was chosen, the loop's own losses
against the same loop without the attach, and, with the engine's ``queue_callback`` gone, the
session's notice."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.drift_hook import _EngineWithoutQueueCallback

ITERATIONS = 5


def _train(rank: int, world: int, collector: str, how: str, attach: bool) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    if attach:
        from zeroscope.agent.attach import install

        install.install()
    dist.init_process_group("gloo")
    if how == "drifted":
        variable: Any = torch.autograd.Variable
        variable._execution_engine = _EngineWithoutQueueCallback(variable._execution_engine)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    losses, phases = [], []
    for _ in range(ITERATIONS):
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        if how == "tensor":
            loss.backward()
        else:
            torch.autograd.backward(loss)  # not through Tensor.backward
        if attach:
            from zeroscope.agent.attach.session import SESSION

            phases.append([scope.name for scope, _, _ in SESSION.tel._marks])
        opt.step()
        opt.zero_grad()
    out: dict = {"losses": losses, "phases": phases}
    if attach:
        from zeroscope.agent.attach import torch_loop
        from zeroscope.agent.attach.session import SESSION

        out.update(mode=torch_loop._backward.mode, lost=dict(SESSION._lost))
        out["steps"], out["errors"] = SESSION.steps, SESSION.errors
    return out


@pytest.mark.parametrize(
    ("how", "mode", "timed"),
    [("tensor", "wrapper", True), ("autograd", "hook", True), ("drifted", "hook", False)],
)
def test_backward_is_timed_through_the_call_or_the_engine(how: str, mode: str, timed: bool) -> None:
    from tests.distributed import run_ranks, sink_collector

    collector = sink_collector()
    (plain,) = run_ranks(_train, 1, collector, how, False, timeout=120)
    (r,) = run_ranks(_train, 1, collector, how, True, timeout=120)
    assert r["losses"] == plain["losses"]  # the job trains the same, whichever way
    assert r["mode"] == mode and r["steps"] == ITERATIONS and r["errors"] == 0
    each = ["forward", "forward", "backward", "backward"] if timed else ["forward", "forward"]
    assert r["phases"] == [each] * ITERATIONS  # entered and left once per iteration, in order
    lost = {part for part in r["lost"] if "backward" in part}
    assert lost == (set() if timed else {"the backward phase"})
