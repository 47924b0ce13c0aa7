"""The FLOP count changes nothing the counted step computes. The oracle is the same run without
zeroscope, compared bit for bit: a LoRA'd Llama (tests/jobs/lora_train.py's model) trained a
few steps with the agent's meter counting step 1 has the plain run's gradients and losses.

torch's own FlopCounterMode fails this (the control below): for an op without a FLOP formula
its dispatch mode runs the op's CompositeImplicitAutograd decomposition instead of the op's
kernel, and ``aten.silu_backward`` (every SwiGLU MLP's backward) has one that rounds
differently from the fused kernel. That is what moved the LoRA'd Llama's losses from step 2 on
under DeepSpeed and the bundled engine while the count used it; agent/flops.py counts with the
same formulas and runs every op as called."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.attach_support import JOBS
from zeroscope.agent.flops import StepFlops, cpu_attention_formulas
from zeroscope.agent.work import WorkMeter, work_report

pytest.importorskip("peft")  # a dev dependency (pyproject.toml); the LoRA model needs it

STEPS = 3


def _lora_llama(dtype: torch.dtype) -> torch.nn.Module:
    import importlib.util

    spec = importlib.util.spec_from_file_location("lora_train", JOBS / "lora_train.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job.build_model().to(dtype)


def _train(dtype: torch.dtype, count: str) -> tuple[list[str], list[torch.Tensor], float | None]:
    """(losses as exact hex, step 1's gradients, the meter's FLOPs) with the count by ``count``:
    "none", "meter" (the agent's WorkMeter over each step) or "torch" (FlopCounterMode)."""
    model = _lora_llama(dtype)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    meter = WorkMeter()
    data = torch.Generator().manual_seed(1000)
    losses, grads, flops = [], [], None
    for step in range(1, STEPS + 1):
        ids = torch.randint(0, 64, (2, 8), generator=data)
        torch_counter = FlopCounterMode(display=False) if count == "torch" and step == 1 else None
        if torch_counter is not None:
            torch_counter.__enter__()
        if count == "meter":
            meter.inputs(model, (), {"input_ids": ids, "labels": ids}, step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if torch_counter is not None:
            torch_counter.__exit__(None, None, None)
        if count == "meter":
            facts = meter.take(step)
            assert facts is not None
            flops = work_report(facts).flops if step == 1 else flops
        if step == 1:
            grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
        opt.step()
        opt.zero_grad()
        losses.append(loss.item().hex())
    return losses, grads, flops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_counted_step_and_every_later_one_are_bit_identical(dtype: torch.dtype) -> None:
    torch.set_num_threads(1)
    plain_losses, plain_grads, _ = _train(dtype, "none")
    losses, grads, flops = _train(dtype, "meter")
    assert flops is not None and flops > 0  # the step was counted
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
    assert losses == plain_losses


def test_torch_flop_counter_mode_moves_the_gradients_it_counts() -> None:
    """The control: the harness above catches the change FlopCounterMode makes, in the counted
    step's gradients (if a torch release makes its decomposition exact, this fails and
    agent/flops.py's reason is stale). Not in the later losses: AdamW's first update is
    lr x g / (|g| + eps), about lr x sign(g), so a last-bit change of step 1's gradients
    reaches step 2's loss only through components near eps; with transformers 5.24's Llama the
    three losses came out equal while the gradients differed."""
    torch.set_num_threads(1)
    _, plain_grads, _ = _train(torch.float32, "none")
    _, grads, _ = _train(torch.float32, "torch")
    assert not all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))


def test_silu_backward_is_the_op_its_decomposition_changes() -> None:
    """The exact op: its fused kernel against the decomposition FlopCounterMode runs."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, generator=g)
    grad = torch.randn(4096, generator=g)
    fused = torch.ops.aten.silu_backward.default(grad, x)
    decomposed = torch.ops.aten.silu_backward.default.decompose(grad, x)
    assert decomposed is not NotImplemented and not torch.equal(fused, decomposed)
    with StepFlops():
        counted = torch.ops.aten.silu_backward.default(grad, x)
    assert torch.equal(counted, fused)


def test_the_count_equals_flop_counter_modes_on_the_llama() -> None:
    """Same formulas, so the same total: the decompositions StepFlops does not run hold no
    matmul here (an independent count: torch's own mode over the same step)."""
    torch.set_num_threads(1)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    totals = []
    for mode in ("ours", "torch"):
        model = _lora_llama(torch.float32)
        counter: StepFlops | FlopCounterMode = (
            StepFlops()
            if mode == "ours"
            else FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas())
        )
        with counter:
            model(input_ids=ids, labels=ids).loss.backward()
        totals.append(
            counter.total if isinstance(counter, StepFlops) else counter.get_total_flops()
        )
    assert totals[0] == totals[1] > 0


def test_a_formula_that_raises_never_reaches_the_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose formula for an op breaks on some input: the job's op still runs and
    returns its own result, and the count is NA with the op named (never a short total)."""
    from zeroscope.agent import flops as flops_mod

    def broken(*args: object, **kwargs: object) -> int:
        raise TypeError("a formula torch changed")

    aten = torch.ops.aten
    monkeypatch.setattr(flops_mod, "formulas", lambda: {aten.mm: broken, aten.addmm: broken})
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8, 8)  # a batch of 4 embedded sequences of 8
    plain = model(x).sum()
    meter = WorkMeter()
    meter.inputs(model, (x,), {}, 1)
    counted = model(x).sum()
    counted.backward()
    facts = meter.take(1)
    assert facts is not None
    w = work_report(facts)
    assert torch.equal(plain, counted)
    assert w.flops is None and "formula for aten." in w.na and "failed" in w.na
    assert w.tokens == 32
