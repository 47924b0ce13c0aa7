"""An HF ``Trainer`` on one device (no DDP, FSDP or DeepSpeed underneath: a single-GPU
fine-tune, and TRL's ``SFTTrainer`` with it) under ``zeroscope run``, script unchanged
(tests/jobs/hf_trainer_one_device.py).

Before, the Trainer named its model to the attach (for P's frozen part) and that stopped the
plain loop's model search (agent/attach/plain_model.py): nothing wrapped the model's forward,
so every step showed no forward phase, A NA, and tokens, FLOPs and MFU NA ("no model forward
seen"). Now its model is found at the first optimizer step as a loop's is, and timed from the
next; so is each Trainer's of a script that trains two in turn (a sweep).

Oracles: the run under bare torchrun (losses, bit for bit); the masks' sums the script counted
(tokens leave padding out); micro x seq x accumulation (positions); the closed form of the
Llama's FLOPs (tests/test_throughput_attach.py); the Trainer's own parallel mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import plain_and_watched
from tests.jobs.throughput_train import ACCUMULATION, LLAMA, MICRO, SEQ, llama_dense_params
from zeroscope.agent.attach.plain_model import FOUND_NOW

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "jobs" / "hf_trainer_one_device.py"
STEPS = 3
TRAINERS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("hf-one-device")
    return plain_and_watched(SCRIPT, STEPS, tmp, extra=("--trainers", str(TRAINERS)))


def test_the_trainer_ran_alone_and_its_losses_are_bit_identical(runs: tuple) -> None:
    trace, plain, watched = runs
    for alone, zs in zip(plain, watched, strict=True):
        assert len(alone) == len(zs) == TRAINERS
        for trainer_alone, trainer_zs in zip(alone, zs, strict=True):
            assert trainer_alone["parallel_mode"] == trainer_zs["parallel_mode"] == "not_parallel"
            assert trainer_zs["losses"] == trainer_alone["losses"]
            # An evaluation builds its dataloader after the model was wrapped: the wrapper
            # keeps the forward's signature, whose parameters name the columns it keeps.
            assert trainer_zs["evaluations"]  # at step 2, and the Trainer's last
            assert trainer_zs["evaluations"] == trainer_alone["evaluations"]
    for rank in range(2):
        assert trace[rank].hellos[-1].engine == "hf-trainer+torch"


def test_the_models_forward_is_timed_and_its_tokens_and_flops_counted(runs: tuple) -> None:
    trace, _, watched = runs
    positions = MICRO * SEQ * ACCUMULATION
    h, layers = LLAMA["hidden_size"], LLAMA["num_hidden_layers"]
    dense = 6.0 * llama_dense_params() * positions
    attention = 12.0 * layers * h * SEQ * positions
    for rank in range(2):
        steps = trace[rank].steps
        assert [s.step for s in steps] == list(range(1, TRAINERS * STEPS + 1))
        for i, said in enumerate(watched[rank]):
            first, *rest = steps[i * STEPS : (i + 1) * STEPS]
            # Each Trainer's step 1 ends where its model is found: its forward ran unwatched,
            # and says so. Its time runs from the Trainer's on_step_begin (it read 0 s): at
            # least its micro-batches' span and at most train()'s, on the script's own clock.
            assert first.phases.forward is None
            assert said["step1_forwards_s"] <= first.duration_s <= said["train_s"], first
            assert first.work is not None and first.work.tokens is None
            assert first.work.na == FOUND_NOW
            # Its gradients were not counted (the optimizer's reader is found at that step's
            # end, after its pre-hook; the second Trainer's were counted by the first one's
            # optimizer): NA, not the 0 bytes they read before. Then counted, on the next step:
            # every parameter trains, in fp32, so G holds as many bytes as P.
            assert first.memory.grads is None, first.memory
            assert rest[0].memory.grads == rest[0].memory.params > 0, rest[0].memory
            for report, tokens in zip(rest, said["tokens"][1:], strict=True):
                assert report.phases.forward and report.phases.forward > 0
                w = report.work
                assert w is not None and w.na == "", w
                assert w.positions == positions and w.tokens == tokens < positions
                assert w.dense_params == llama_dense_params()
                # torch counts the attention backward's recomputed scores: 7/6 of the
                # textbook term (as under DDP, tests/test_throughput_attach.py).
                assert w.flops == dense + attention * 7 / 6
            assert rest[0].memory.activations, rest[0].memory  # A counted on the first steps
        assert watched[rank][0]["tokens"] != watched[rank][1]["tokens"]  # each its own data


def test_each_steps_gradient_norm_is_the_one_the_trainer_logged(runs: tuple) -> None:
    """The Trainer clips through accelerate's ``clip_grad_norm_`` (``max_grad_norm`` 1.0 by
    default) and logs the norm it got: each step's norm is that one."""
    trace, _, watched = runs
    for rank in range(2):
        logged = [norm for said in watched[rank] for norm in said["grad_norms"]]
        assert len(logged) == TRAINERS * STEPS
        assert [s.grad_norm for s in trace[rank].steps] == logged, rank
