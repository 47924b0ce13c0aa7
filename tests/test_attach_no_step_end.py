"""A loop whose step end the attach never sees costs the job no more than a loop with steps.

A DDP model trained by a manual SGD update (no torch optimizer, so no hook ends a step) kept
the whole run inside the first step, which the agent measures in full: every op ran under the
FLOP counter's Python dispatch (a DDP MLP ran 60 % slower), every forward's saved tensors were
counted, and every micro-batch loss was held as a tensor (~0.4 MB of RSS an iteration there,
each pinning its block in the heap). Oracles: torch's own dispatch-mode stack (the counter is
on it while it counts), the agent's counted-forward count against its bound, the loop's own
losses (the floats the agent keeps equal them bit for bit), and the session's tensors held."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

FLOP_BOUND = 6
"""The FLOP count's forward bound, lowered in the rank (the default is 256)."""
COUNT_BOUND = 9
"""The activation count's forward bound, lowered in the rank (the default is 256)."""
ITERATIONS = 150


def _manual_sgd(rank: int, world: int, collector: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from zeroscope.agent import live, work
    from zeroscope.agent.attach import install, session

    install.install()
    work.MAX_COUNTED_FORWARDS = FLOP_BOUND
    live.MAX_COUNTED_FORWARDS = COUNT_BOUND
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    model = torch.nn.parallel.DistributedDataParallel(net)
    x, y = torch.randn(4, 8), torch.randn(4, 1)
    s = session.SESSION
    depth: list[int] = []
    losses: list[float] = []
    for _ in range(ITERATIONS):
        loss = torch.nn.functional.mse_loss(model(x), y)
        depth.append(torch._C._len_torch_dispatch_stack())  # after the forward, counting or not
        losses.append(float(loss))
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
                p.grad = None
    tel = s.tel
    held = [loss for loss, _ in s._losses]
    return {
        "depth": depth,
        "counted_forwards": tel._counted_this_step,
        "plain": tel._plain,
        "flops_na": tel.work._na_flops,
        "tensors_held": sum(isinstance(v, torch.Tensor) for v in held),
        "losses_held": [float(v) for v in held],
        "losses": losses,
        "steps": s.steps,
        "errors": s.errors,
    }


def test_a_loop_with_no_step_end_is_measured_within_bounds() -> None:
    from tests.distributed import run_ranks, sink_collector
    from zeroscope.agent.attach.losses import LOSSES_HELD

    collector = sink_collector()
    (r,) = run_ranks(_manual_sgd, 1, collector, timeout=180)
    assert r["steps"] == 0 and r["errors"] == 0  # no step end was ever seen
    # The FLOP count ran (its mode on torch's stack) for its bound's forwards, then stopped.
    assert r["depth"][:FLOP_BOUND] == [1] * FLOP_BOUND
    assert set(r["depth"][FLOP_BOUND:]) == {0}
    assert "without a step end" in r["flops_na"]
    # Saved tensors were counted for the first forwards only; the rest take the lean path.
    assert r["counted_forwards"] == COUNT_BOUND
    assert r["plain"] is True
    # Every micro-batch loss is kept, as floats past the bound: the loop's own values.
    assert r["losses_held"] == r["losses"]
    assert r["tensors_held"] == ITERATIONS % LOSSES_HELD
