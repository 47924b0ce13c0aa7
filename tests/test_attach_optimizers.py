"""Which optimizer's ``step()`` ends a step of a plain torch loop. Two optimizers stepping in
turn (a GAN) keep the first as the step's end; a script that swaps its optimizer while still
holding the old one has its steps reported again once the new one has stepped
``TAKE_OVER_AFTER`` times (before, no step was reported for the rest of the run: a new user's
SGD warm-up then Adam showed 30 steps of 300). Oracles: the loop's own count of each
optimizer's steps, and the optimizer whose state the reader then counts."""

from __future__ import annotations

import os

import torch


def _loop(rank: int, world: int, dead: str, how: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = dead
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION, TAKE_OVER_AFTER

    install.install()
    torch.manual_seed(0)
    g, d = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    x = torch.randn(8, 4)
    opt_g, opt_d = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    adam = torch.optim.Adam(g.parameters(), lr=1e-3)
    reported = []
    if how == "gan":
        for _ in range(20):
            d(g(x).detach()).mean().backward()
            opt_d.step()
            opt_d.zero_grad()
            d(g(x)).mean().backward()
            opt_g.step()
            opt_g.zero_grad()
            reported.append(SESSION.steps)
    else:  # SGD warm-up, then Adam; the SGD object stays referenced
        for i in range(25):
            g(x).pow(2).mean().backward()
            (opt_g if i < 5 else adam).step()
            g.zero_grad()
            reported.append(SESSION.steps)
    reader = SESSION.reader
    return {
        "reported": reported,
        "take_over": TAKE_OVER_AFTER,
        "reads_adam": reader is not None and reader._optimizer() is adam,
    }


def test_two_optimizers_in_turn_keep_the_first_as_the_steps_end() -> None:
    from tests.distributed import free_port, run_ranks

    (r,) = run_ranks(_loop, 1, f"tcp://127.0.0.1:{free_port()}", "gan", timeout=120)
    assert r["reported"] == list(range(1, 21))  # one step per iteration, at opt_d's step


def test_a_swapped_optimizer_takes_over_the_steps() -> None:
    from tests.distributed import free_port, run_ranks

    (r,) = run_ranks(_loop, 1, f"tcp://127.0.0.1:{free_port()}", "swap", timeout=120)
    k = r["take_over"]
    # SGD's 5 steps, then nothing until Adam's k-th step, then every Adam step.
    expected = list(range(1, 6)) + [5] * (k - 1) + list(range(6, 6 + 20 - (k - 1)))
    assert r["reported"] == expected
    assert r["reads_adam"]


class _Flaky(torch.optim.SGD):
    """An SGD whose third ``step()`` raises (a script catches it and trains on)."""

    calls = 0

    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        _Flaky.calls += 1
        if _Flaky.calls == 3:
            raise RuntimeError("a step that failed")
        return super().step(closure)


def _raising_step(rank: int, world: int, dead: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = dead
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION

    install.install()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = _Flaky(model.parameters(), lr=0.1)
    phases: list[list[str]] = []
    model(torch.randn(8, 4)).pow(2).mean().backward()  # the agent starts at the first step
    opt.step()
    opt.zero_grad()
    end = SESSION.tel.step_end

    def step_end(**figures: object) -> None:
        phases.append([scope.name for scope, _, _ in SESSION.tel._marks])
        end(**figures)

    SESSION.tel.step_end = step_end
    for _ in range(5):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        try:
            opt.step()
        except RuntimeError:
            pass
        opt.zero_grad()
    return {"phases": phases, "steps": SESSION.steps, "errors": SESSION.errors}


def test_a_step_that_raised_leaves_the_next_optimizer_phases_timed() -> None:
    from tests.distributed import free_port, run_ranks

    (r,) = run_ranks(_raising_step, 1, f"tcp://127.0.0.1:{free_port()}", timeout=120)
    assert r["steps"] == 5 and r["errors"] == 0  # six step() calls, one raised
    assert len(r["phases"]) == 4
    # Each reported step after the failure times its optimizer phase (enter and exit); the
    # failed call's unfinished phase is taken back. Before, none was timed after it.
    assert all(names.count("optimizer") == 2 for names in r["phases"]), r["phases"]


def _lbfgs(rank: int, world: int, dead: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = dead
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION

    install.install()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5)
    evaluations = [0]

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        evaluations[0] += 1
        return loss

    returned = [float(opt.step(closure))]  # the agent starts at the first step
    shown: list[float] = []
    end = SESSION.tel.step_end

    def step_end(**figures: object) -> None:
        shown.append(float(figures["loss"]))  # type: ignore[arg-type]
        end(**figures)

    SESSION.tel.step_end = step_end
    for _ in range(4):
        returned.append(float(opt.step(closure)))
    return {"shown": shown, "returned": returned[1:], "evaluations": evaluations[0]}


def test_a_closure_step_shows_the_loss_step_returns() -> None:
    """LBFGS evaluates its closure several times a step (a line search); the step shows the
    loss ``step()`` returns, its first evaluation's, not the mean of every evaluation."""
    from tests.distributed import free_port, run_ranks

    (r,) = run_ranks(_lbfgs, 1, f"tcp://127.0.0.1:{free_port()}", timeout=120)
    assert r["evaluations"] > 5  # several evaluations a step: the mean would differ
    assert r["shown"] == r["returned"]
