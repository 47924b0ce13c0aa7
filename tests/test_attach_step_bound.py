"""A loop whose step end the attach never sees holds no more of the agent's memory as it runs.

Gradients computed with no ``optimizer.step()`` (a probe, an evaluation with autograd on, an
optimizer zeroscope does not hook): every DDP forward and backward is a phase the agent keeps a
raw mark of until the step ends, and every forward's inputs a shape. Before the bound, 1,000
such iterations left 4,000 marks and 1,000 shapes behind, growing for the whole run. Oracles:
the counts a bounded step may hold (the cap's phases, two marks each; one shape per forward
timed), the same counts after 3x more iterations (no growth), the session's notice, and phases
timed again once a step ends."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

CAP = 40
"""The bound, lowered in the rank so the test runs ~100 iterations, not ~8,000."""


def _gradients_without_a_step(rank: int, world: int, collector: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from zeroscope.agent.attach import install, session

    install.install()
    session.MAX_PHASES_PER_STEP = CAP
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 8)
    s = session.SESSION
    held = []
    for rounds in (30, 90):
        for _ in range(rounds):
            model(x).pow(2).mean().backward()  # gradients, no step
        held.append((len(s.tel._marks), len(s.tel.work._shapes)))
    said = [part for part in s._lost if "past its first" in part]
    opt.step()  # a step end: the step is reported, and recording starts again
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    after = (len(s.tel._marks), len(s.tel.work._shapes))
    return {"held": held, "said": said, "after": after, "errors": s.errors}


def test_a_loop_with_no_step_end_holds_a_bounded_step() -> None:
    from tests.distributed import run_ranks, sink_collector

    collector = sink_collector()
    (result,) = run_ranks(_gradients_without_a_step, 1, collector, timeout=180)
    # A forward and a backward phase an iteration: CAP phases are CAP // 2 iterations timed,
    # two marks a phase; their forwards' inputs are one shape each.
    bounded = (2 * CAP, CAP // 2)
    assert result["held"] == [bounded, bounded]  # 30 iterations past the cap, then 120
    assert len(result["said"]) == 1
    assert result["after"] == (4, 1)  # the next step: its forward and backward, timed again
    assert result["errors"] == 0
