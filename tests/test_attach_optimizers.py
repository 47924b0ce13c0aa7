"""Which optimizer's ``step()`` ends a step of a plain torch loop. Two optimizers stepping in
turn (a GAN, or matrices with one and the rest with another) end the step at the last of them,
and O is both optimizers' state; a script that swaps its optimizer while still
holding the old one has its steps reported again once the new one has stepped
``TAKE_OVER_AFTER`` times (before, no step was reported for the rest of the run: a new user's
SGD warm-up then Adam showed 30 steps of 300). Oracles: the loop's own count of each
optimizer's steps, and the optimizer whose state the reader then counts."""

from __future__ import annotations

import os

import torch


def _loop(rank: int, world: int, collector: str, how: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.optimizer_cycle import TAKE_OVER_AFTER
    from zeroscope.agent.attach.session import SESSION

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


def test_two_optimizers_in_turn_give_one_step_an_iteration() -> None:
    from tests.distributed import run_ranks, sink_collector

    (r,) = run_ranks(_loop, 1, sink_collector(), "gan", timeout=120)
    assert r["reported"] == list(range(1, 21))  # one step per iteration


def test_a_swapped_optimizer_takes_over_the_steps() -> None:
    from tests.distributed import run_ranks, sink_collector

    (r,) = run_ranks(_loop, 1, sink_collector(), "swap", timeout=120)
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


def _raising_step(rank: int, world: int, collector: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
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
    from tests.distributed import run_ranks, sink_collector

    (r,) = run_ranks(_raising_step, 1, sink_collector(), timeout=120)
    assert r["steps"] == 5 and r["errors"] == 0  # six step() calls, one raised
    assert len(r["phases"]) == 4
    # Each reported step after the failure times its optimizer phase (enter and exit); the
    # failed call's unfinished phase is taken back. Before, none was timed after it.
    assert all(names.count("optimizer") == 2 for names in r["phases"]), r["phases"]


def _lbfgs(rank: int, world: int, collector: str) -> dict:
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
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
    from tests.distributed import run_ranks, sink_collector

    (r,) = run_ranks(_lbfgs, 1, sink_collector(), timeout=120)
    assert r["evaluations"] > 5  # several evaluations a step: the mean would differ
    assert r["shown"] == r["returned"]


def _split(rank: int, world: int, collector: str, every: int = 1) -> dict:
    """Matrices stepped by SGD with momentum, biases and norms by AdamW, both every iteration
    (the Muon + AdamW recipes' shape)."""
    os.environ["ZEROSCOPE_COLLECTOR"] = collector
    from zeroscope.agent.attach import install
    from zeroscope.agent.attach.session import SESSION

    install.install()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    )
    mats = [p for p in net.parameters() if p.ndim == 2]
    rest = [p for p in net.parameters() if p.ndim != 2]
    sgd = torch.optim.SGD(mats, lr=1e-2, momentum=0.9)
    adamw = torch.optim.AdamW(rest, lr=1e-3)
    shown: list[dict] = []
    after_first: list[int] = []  # steps reported once the first optimizer of an iteration ran
    after_both: list[int] = []

    def iteration() -> None:
        loss = net(torch.randn(8, 16)).pow(2).mean()
        sgd.zero_grad()
        adamw.zero_grad()
        loss.backward()
        sgd.step()
        after_first.append(SESSION.steps)
        if len(after_first) % every == 0:  # AdamW every ``every``-th iteration
            adamw.step()
        after_both.append(SESSION.steps)

    iteration()  # the agent starts at the first step: watch every report from here
    end = SESSION.tel.step_end

    def step_end(**figures: object) -> None:
        memory = figures["memory"]
        shown.append({"optim": memory.optim, "params": memory.params})  # type: ignore[attr-defined]
        end(**figures)

    SESSION.tel.step_end = step_end
    for _ in range(5):
        iteration()
    state_bytes = sum(
        t.numel() * t.element_size()
        for opt in (sgd, adamw)
        for st in opt.state.values()
        for t in st.values()
        if isinstance(t, torch.Tensor)
    )
    config, counts, _ = SESSION.reader.hello()  # type: ignore[union-attr]
    return {
        "after_first": after_first,
        "after_both": after_both,
        "shown": shown,
        "state_bytes": state_bytes,
        "param_bytes": sum(p.numel() * 4 for p in net.parameters()),
        "optimizer": config.optimizer,
        "elements": config.optimizer_state_elements,
        "expected_elements": sum(p.numel() for p in mats) + 2 * sum(p.numel() for p in rest),
        "trainable": counts.trainable,
        "numel": sum(p.numel() for p in net.parameters()),
    }


def test_two_optimizers_every_iteration_end_the_step_at_the_last_and_count_both() -> None:
    """Before, the step ended at SGD's ``step()`` (AdamW's fell into the next step), O was
    SGD's momentum alone and the Hello said ``SGD``: AdamW's state was missing from O."""
    from tests.distributed import run_ranks, sink_collector

    (r,) = run_ranks(_split, 1, sink_collector(), timeout=120)
    # Iterations 1 and 2 end at SGD (no cycle, then one: not yet seen twice); from the third
    # on, at AdamW's step().
    assert r["after_both"] == list(range(1, 7))
    assert r["after_first"] == [1, 2, 2, 3, 4, 5]
    # Each counted step's O is both optimizers' state, as the test counts it; P every parameter.
    counted = [s for s in r["shown"] if s["optim"] is not None]
    assert counted and all(s["optim"] == r["state_bytes"] for s in counted), counted
    assert all(s["params"] == r["param_bytes"] for s in counted)
    assert r["optimizer"] == "SGD+AdamW"
    assert r["elements"] == r["expected_elements"]  # momentum 1 a matrix element, AdamW 2
    assert r["trainable"] == r["numel"]


def test_a_second_optimizer_stepping_every_other_iteration_keeps_one_step_an_iteration() -> None:
    """Cycles that differ (AdamW in every other one) never move the step's end off the first
    optimizer: each iteration is one step (ending at the last optimizer of the cycle before
    would have skipped every iteration without it)."""
    from tests.distributed import run_ranks, sink_collector

    (r,) = run_ranks(_split, 1, sink_collector(), 2, timeout=120)
    assert r["after_first"] == list(range(1, 7))
    assert r["after_both"] == list(range(1, 7))
