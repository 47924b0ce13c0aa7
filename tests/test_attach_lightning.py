"""An unmodified PyTorch Lightning job under ``zeroscope run`` (tests/jobs/lightning_train.py:
``Trainer(strategy="ddp")`` on 2 CPU ranks, accumulating gradients over 3 micro-batches), in fp32
and in Lightning's 16-mixed precision with a GradScaler. In fp32 Lightning runs the first
micro-batches of each step itself and the last inside ``optimizer.step(closure=...)``; in 16-mixed
it runs every closure itself and hands each loss to ``scaler.scale()``. Both divide each loss by
the accumulation before its backward: the step's loss is the mean of all of them, undivided
(before, fp32 dropped the closure's loss as a sharpness-aware step's repeat and showed the first
micro-batch's divided by 3; 16-mixed showed the mean divided by 3). Oracles: each rank's own
account of its micro-batches (the losses ``training_step`` returned, the tokens its batches
held, the scaler's scale after each step, Lightning's ``global_step``) and the same job under
bare torchrun."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from tests.attach_support import JOBS, plain_and_watched
from zeroscope.agent.attach.torch_loop import runs_a_micro_batch

SCRIPT = JOBS / "lightning_train.py"
STEPS, ACCUM = 4, 3


@pytest.fixture(scope="module", params=["fp32", "fp16-scaler"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    extra = ("--accum", str(ACCUM)) + (("--fp16-scaler",) if request.param != "fp32" else ())
    tmp = tmp_path_factory.mktemp("lightning")
    trace, plain, zs = plain_and_watched(SCRIPT, STEPS, tmp, timeout=600, extra=extra)
    return {"plain": plain, "zs": zs, "trace": trace}


@pytest.mark.slow
def test_losses_are_bit_identical_with_and_without_zeroscope(runs: dict) -> None:
    assert runs["zs"] == runs["plain"]


@pytest.mark.slow
def test_each_optimizer_step_is_one_step(runs: dict) -> None:
    for rank in range(2):
        own = runs["zs"][rank]
        assert own["steps"] == STEPS and [len(m) for m in own["losses"]] == [ACCUM] * STEPS
        assert [s.step for s in runs["trace"][rank].steps] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_the_loss_is_the_mean_of_every_micro_batch_undivided(runs: dict) -> None:
    for rank in range(2):
        for step, micro in zip(runs["trace"][rank].steps, runs["zs"][rank]["losses"], strict=True):
            expected = sum(float.fromhex(x) for x in micro) / len(micro)
            assert step.loss is not None
            assert abs(step.loss - expected) <= 1e-6 * expected, (rank, step.step)


@pytest.mark.slow
def test_the_scale_after_each_step_is_the_scalers(runs: dict) -> None:
    """NA without a scaler; with one, the scale its ``update()`` left, growing in this run."""
    for rank in range(2):
        own = runs["zs"][rank]["scales"]
        assert [s.loss_scale for s in runs["trace"][rank].steps] == own
        assert own[0] is None or len(set(own)) > 1


@pytest.mark.slow
def test_tokens_come_from_the_tuple_batch(runs: dict) -> None:
    """Lightning hands DDP's forward ``(batch, batch_idx)`` with ``batch`` a list of tensors."""
    for rank in range(2):
        tokens = [s.work.tokens if s.work else None for s in runs["trace"][rank].steps]
        assert tokens == runs["zs"][rank]["tokens"]


def test_lightnings_closure_runs_a_micro_batch_and_others_do_not() -> None:
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    def closure() -> None:
        return None

    for plugin in (Precision(), MixedPrecision("bf16-mixed", "cpu")):  # as Precision.optimizer_step
        nothing: Any = None  # the model and optimizer: never called here
        wrapped = partial(plugin._wrap_closure, nothing, nothing, closure)
        assert runs_a_micro_batch((), {"closure": wrapped})
        assert runs_a_micro_batch((wrapped,), {})
    assert not runs_a_micro_batch((), {"closure": closure})  # LBFGS, SAM: the script's own
    assert not runs_a_micro_batch((partial(closure),), {})
    assert not runs_a_micro_batch((), {})
    assert not runs_a_micro_batch((), {"closure": None})
