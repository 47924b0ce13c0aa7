"""A DDP loop in nanoGPT's shape under ``zeroscope run`` (tests/jobs/grad_sync_flag_train.py: 2 CPU
ranks, accumulation over 2 micro-batches by ``model.require_backward_grad_sync`` set by hand,
each loss divided before ``scaler.scale(loss).backward()`` with the GradScaler off, clipping
after ``unscale_``, an evaluation on rank 0 alone every other iteration), fp32 (the job takes
``--bf16`` too). Oracles: each rank's own account (its micro-batch losses, tokens, evaluations),
the model's parameter count, and the same job under bare torchrun."""

from __future__ import annotations

import pytest

from tests.attach_support import JOBS, bytes_by_op, plain_and_watched

pytestmark = pytest.mark.slow

SCRIPT = JOBS / "grad_sync_flag_train.py"
STEPS, ACCUM = 5, 2


@pytest.fixture(scope="module", params=["fp32"])  # (bf16: tests/test_attach_accelerate_*)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    extra = ("--accum", str(ACCUM)) + (("--bf16",) if request.param == "bf16" else ())
    tmp = tmp_path_factory.mktemp("grad-sync-flag")
    trace, plain, zs = plain_and_watched(SCRIPT, STEPS, tmp, timeout=600, extra=extra)
    return {"plain": plain, "zs": zs, "trace": trace}


def test_losses_are_bit_identical_with_and_without_zeroscope(runs: dict) -> None:
    assert runs["zs"] == runs["plain"]


def test_each_iteration_is_one_step_its_loss_the_micro_batches_mean_undivided(
    runs: dict,
) -> None:
    """A scaler that is off hands ``scale()`` the loss back unchanged: the loss is read at
    each micro-batch's ``backward()``, its divisor undone; the scale is NA (nothing scales)."""
    for rank in range(2):
        own = runs["zs"][rank]["iterations"]
        steps = runs["trace"][rank].steps
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        for step, mine in zip(steps, own, strict=True):
            expected = sum(float.fromhex(x) for x in mine["losses"]) / ACCUM
            assert step.loss is not None
            assert abs(step.loss - expected) <= 1e-6 * expected, (rank, step.step)
            assert step.loss_scale is None and not step.skipped, (rank, step.step)


def test_each_steps_gradient_norm_is_the_one_clipping_returned(runs: dict) -> None:
    """``torch.nn.utils.clip_grad_norm_``'s total norm (before clipping), as the script got it:
    it showed NA for every job but DeepSpeed's."""
    for rank in range(2):
        own = runs["zs"][rank]["iterations"]
        norms = [step.grad_norm for step in runs["trace"][rank].steps]
        assert norms == [float.fromhex(mine["grad_norm"]) for mine in own], rank


def test_only_the_synced_micro_batch_all_reduces_and_every_token_counts(runs: dict) -> None:
    """``require_backward_grad_sync = False`` holds the first micro-batch's reduction: the
    step's all-reduced bytes are the model's fp32 gradients once (4 x its parameters)."""
    for rank in range(2):
        own = runs["zs"][rank]
        for step, mine in zip(runs["trace"][rank].steps, own["iterations"], strict=True):
            assert sum(bytes_by_op(step, "all_reduce")) == 4 * own["params"], (rank, step.step)
            assert step.work is not None and step.work.tokens == mine["tokens"], (rank, step.step)


def test_rank_0s_evaluations_are_its_steps_eval_phase(runs: dict) -> None:
    """The evaluation before an iteration's micro-batches is that step's ``eval`` phase, on
    rank 0 alone (rank 1 never evaluates). The first one runs before training began: it is no
    part of step 1 (agent/timeline.py starts step 1 at its first training phase), which then
    shows no eval phase, as a Trainer's ``evaluate()`` before training is none."""
    for rank in range(2):
        own = runs["zs"][rank]["iterations"]
        assert own[0]["evaluated"] == (rank == 0)
        for step, mine in zip(runs["trace"][rank].steps, own, strict=True):
            expected = mine["evaluated"] and step.step > 1
            assert (step.phases.eval is not None) == expected, (rank, step.step)
