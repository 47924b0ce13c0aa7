"""FLOPs of steps whose shapes were never counted (dynamic padding), from the exact fit of the
counted ones (agent/flops_fit.py): equal to the closed form and to a count of those shapes,
and refused, with the reason, for a model whose work is not of the fit's form."""

from __future__ import annotations

import random

import pytest
import torch

from tests.throughput_support import KnownGPT, closed_form
from zeroscope.agent import work as work_mod
from zeroscope.agent.flops_fit import FlopsFit, terms
from zeroscope.agent.schema import StepReport, Work, decode, encode
from zeroscope.agent.work import WorkMeter, work_report


@pytest.fixture(autouse=True)
def _counting_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(work_mod.FLOPS_ENV, raising=False)


def _run_step(meter: WorkMeter, model: torch.nn.Module, step: int, batches: list) -> Work:
    """One optimizer step of ``batches`` (gradient accumulation: the count pauses at each
    backward's return, as the attach's backward hook does)."""
    for args, kwargs in batches:
        meter.inputs(model, args, kwargs, step)
        model(*args, **kwargs).backward()
        meter.pause()
    facts = meter.take(step)
    assert facts is not None
    return work_report(facts)


def _gpt_batch(b: int, s: int) -> tuple[tuple, dict]:
    idx = torch.randint(0, 64, (b, s))
    return (idx, idx), {}


def test_a_dynamically_padded_runs_steps_all_have_flops_equal_to_the_closed_form() -> None:
    """Two micro-batches a step, each padded to its own length (as a collator that pads to the
    batch's longest sequence does): no step's shapes come back. Before, steps 5 on had FLOPs
    NA ("4 counts spent")."""
    torch.manual_seed(0)
    rng = random.Random(1)
    model, meter = KnownGPT(seq=48), WorkMeter()
    works = []
    lengths = rng.sample(range(3, 49), 20)  # never the same step twice (that one is checked)
    for step in range(1, 11):
        shapes = [(rng.choice([1, 2, 3]), lengths.pop()) for _ in range(2)]
        works.append(_run_step(meter, model, step, [_gpt_batch(b, s) for b, s in shapes]))
        expected = sum(sum(closed_form(b * s, seq=s)) for b, s in shapes)
        w = works[-1]
        assert w.flops == pytest.approx(expected, rel=1e-12), (step, shapes)
    assert [w.flops_fit for w in works] == [False] * 4 + [True] * 6
    assert [w.flops_step for w in works] == [1, 2, 3, 4] + [4] * 6  # counted, then the fit's
    assert all(not w.na for w in works)
    for w in (works[0], works[-1]):  # through the wire as a report carries it
        sent = StepReport(rank=0, step=1, wall_ns=1, duration_s=1.0, work=w)
        received = decode(encode(sent))
        assert isinstance(received, StepReport) and received.work == w


def test_an_hf_llamas_fitted_flops_equal_a_count_of_the_same_shapes() -> None:
    """A real decoder (transformers' Llama, SDPA attention, GQA, right padding with a mask):
    the fit's FLOPs for new lengths equal what a fresh meter counts for them."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)

    def batch(b: int, s: int) -> tuple[tuple, dict]:
        ids = torch.randint(0, 96, (b, s))
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, s // 2 :] = 0  # the shorter sequence of the batch, padded on the right
        return (), {"input_ids": ids, "attention_mask": mask, "labels": ids}

    class Loss(torch.nn.Module):  # the meter sees the model; the loss is the HF output's
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, **kw: torch.Tensor) -> torch.Tensor:
            return self.inner(**kw).loss

    wrapped, meter = Loss(), WorkMeter()
    lengths = [(2, 9), (2, 17), (3, 12), (2, 30), (1, 41), (3, 23), (2, 55)]
    works = [_run_step(meter, wrapped, i, [batch(b, s)]) for i, (b, s) in enumerate(lengths, 1)]
    assert [w.flops_fit for w in works] == [False] * 4 + [True] * 3
    for (b, s), w in zip(lengths[4:], works[4:], strict=True):
        counted = _run_step(WorkMeter(), wrapped, 1, [batch(b, s)])
        assert not counted.flops_fit and counted.flops is not None
        assert w.flops == pytest.approx(counted.flops, rel=1e-12), (b, s)


class _PerForwardCost(torch.nn.Module):
    """A matmul over parameters alone in every forward: a cost per micro-batch, not per
    sequence or position, so not of the fit's form."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = KnownGPT(seq=32)
        self.w = torch.nn.Parameter(torch.randn(24, 24))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.gpt(idx, targets) + (self.w @ self.w).mean()


def test_a_model_whose_work_is_not_of_the_fits_form_keeps_its_flops_na_and_says_why() -> None:
    torch.manual_seed(0)
    model, meter = _PerForwardCost(), WorkMeter()
    shapes = [(1, 4), (2, 6), (3, 8), (1, 10), (1, 12), (3, 14)]
    works = [_run_step(meter, model, i, [_gpt_batch(b, s)]) for i, (b, s) in enumerate(shapes, 1)]
    assert [w.flops is not None for w in works] == [True] * 4 + [False] * 2
    assert not any(w.flops_fit for w in works)
    assert "step 4 counted" in works[-1].na and "not of that form" in works[-1].na


def test_the_fit_needs_independent_steps_and_a_verification() -> None:
    fit = FlopsFit()
    form = (5, 7, 11)  # γ, α, β

    def flops(shapes: tuple) -> float:
        row = terms(shapes)
        assert row is not None
        return float(sum(c * x for c, x in zip(form, row, strict=True)))

    same_ratio = [((2, 8),), ((4, 8),), ((6, 8),)]  # one length: Σb·s and Σb·s² follow Σb
    for i, shapes in enumerate(same_ratio, 1):
        fit.add(shapes, flops(shapes), i)
    assert fit.coefficients is None and fit.predict(((2, 9),)) is None
    fit.add(((2, 9),), flops(((2, 9),)), 4)
    fit.add(((1, 20), (3, 5)), flops(((1, 20), (3, 5))), 5)
    assert fit.coefficients is not None and not fit.usable  # solved, not yet verified
    fit.add(((3, 5), (1, 20)), 1.0, 6)  # step 5's micro-batches in another order: no test
    assert not fit.usable and not fit.refused
    fit.add(((2, 31),), flops(((2, 31),)), 7)
    assert fit.usable and fit.verified_step == 7
    assert fit.predict(((4, 100), (1, 3))) == flops(((4, 100), (1, 3)))
    assert fit.predict(((2, 3, 4, 5),)) is None  # not a batch of sequences
    assert terms(()) is None


def test_a_step_left_uncounted_by_its_first_micro_batch_says_so_not_that_counts_ran_out() -> None:
    """A count starts at a step's first micro-batch, when only its shape is known: a step whose
    first shape was counted before (the data check spent) and whose later one is new is not
    counted, with its own reason; before, it read "4 counts spent" after one count."""
    torch.manual_seed(0)
    model, meter = KnownGPT(seq=16), WorkMeter()
    _run_step(meter, model, 1, [_gpt_batch(2, 8), _gpt_batch(2, 12)])
    _run_step(meter, model, 2, [_gpt_batch(2, 8), _gpt_batch(2, 12)])  # the check: equal
    third = _run_step(meter, model, 3, [_gpt_batch(2, 8), _gpt_batch(2, 5)])
    assert third.flops is None and "counts spent" not in third.na
    assert "first micro-batch" in third.na, third.na
