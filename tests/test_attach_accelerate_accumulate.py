"""An unmodified accelerate script accumulating gradients the way accelerate's own example does
(tests/jobs/accelerate_accumulate.py: ``Accelerator(gradient_accumulation_steps=4)``,
``with accelerator.accumulate(model)``, ``optimizer.step()`` called on every micro-batch), 2 CPU
ranks under ``zeroscope run``, in bf16 autocast. accelerate's optimizer wrapper makes
the real step only on the micro-batch whose gradients sync, and ``accelerator.backward``
divides each loss by 4: a step is the real optimizer step, its loss the mean of its micro-batches'
losses undivided, and DDP's bucket all-reduces run once a step (``no_sync()`` on the others).
Oracles: each rank's own account (accelerate's ``sync_gradients``, the losses the model
returned, the tokens of its batches), the model's parameter count, and the same job under bare
torchrun."""

from __future__ import annotations

import pytest

from tests.attach_support import JOBS, bytes_by_op, plain_and_watched

pytestmark = pytest.mark.slow

SCRIPT = JOBS / "accelerate_accumulate.py"
STEPS, ACCUM = 3, 4


@pytest.fixture(scope="module", params=["bf16"])  # (fp32's path is the same, less autocast)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    extra = ("--accum", str(ACCUM), "--mixed-precision", request.param)
    tmp = tmp_path_factory.mktemp("accelerate")
    trace, plain, zs = plain_and_watched(SCRIPT, STEPS, tmp, timeout=600, extra=extra)
    return {"plain": plain, "zs": zs, "trace": trace}


def test_losses_are_bit_identical_with_and_without_zeroscope(runs: dict) -> None:
    assert runs["zs"] == runs["plain"]
    assert all(own["distributed"] == "DistributedType.MULTI_CPU" for own in runs["zs"])


def test_a_step_is_the_real_optimizer_step_of_ddp(runs: dict) -> None:
    for rank in range(2):
        own = runs["zs"][rank]["steps"]
        assert [s["syncs"] for s in own] == [[False] * (ACCUM - 1) + [True]] * STEPS
        steps = runs["trace"][rank].steps
        assert [s.step for s in steps] == list(range(1, len(own) + 1))
        assert runs["trace"][rank].hellos[-1].engine == "ddp"


def test_the_loss_is_the_mean_of_the_micro_batches_undivided(runs: dict) -> None:
    for rank in range(2):
        own = runs["zs"][rank]["steps"]
        for step, mine in zip(runs["trace"][rank].steps, own, strict=True):
            expected = sum(float.fromhex(x) for x in mine["losses"]) / ACCUM
            assert step.loss is not None
            assert abs(step.loss - expected) <= 1e-6 * expected, (rank, step.step)


def test_tokens_and_the_all_reduced_bytes_are_the_steps(runs: dict) -> None:
    """Every micro-batch's tokens in its step; the buckets' all-reduces once a step, all the
    model's fp32 gradients (the micro-batches under ``no_sync()`` reduce nothing)."""
    for rank in range(2):
        own = runs["zs"][rank]
        for step, mine in zip(runs["trace"][rank].steps, own["steps"], strict=True):
            assert step.work is not None and step.work.tokens == mine["tokens"], step.step
            assert sum(bytes_by_op(step, "all_reduce")) == 4 * own["params"], step.step
