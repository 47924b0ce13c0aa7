"""A torch release that renamed a private API the attach relies on must not change the job:
each such API of the DDP attach is removed, inside the workers, right after the attach installed
(tests/drift_hook.py: two per launch, one per rank), and an unmodified DDP script runs under
``zeroscope run``.
Oracles: the same script under bare torchrun (losses bit for bit), and the run's own console,
which must say what zeroscope lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.attach_support import JOBS, job_env, read_outputs, read_trace, run_plain, run_zeroscope
from zeroscope.agent.attach.flight_recorder import BELOW_PYTHON

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

SCRIPT = JOBS / "torch_parallel_train.py"
ARGS = ["--modes", "ddp", "--steps", "3"]

DRIFTS = {
    # drift: what zeroscope must say it lost
    "fr_dump": f"{BELOW_PYTHON}: not seen",
    "group_sequence": f"{BELOW_PYTHON}: not seen",
    "ddp_logging": "DDP's bucket buffers in G: not seen",
    # Backward is timed around ``Tensor.backward`` (agent/attach/torch_loop.py): autograd's
    # queue_callback is needed only by a job calling ``torch.autograd.backward`` itself
    # (tests/test_attach_backward_timing.py), so a job losing it loses nothing.
    "queue_callback": "",
}


PAIRS = [("fr_dump", "group_sequence"), ("ddp_logging", "queue_callback")]
"""Each launch's drifts, rank 0's then rank 1's: the attach is per process, so each rank meets
its own, the other rank unaffected by it; a failure names the rank, so the drift. The two that
lose the same part are told apart by each rank's own trace (no all-reduce shown as measured);
every rank's trace names its own loss (an event), and not the other's where the parts differ."""


def _part(drift: str) -> str:
    """What the drift makes zeroscope lose, as its console line and trace event name it
    ("" where it loses nothing)."""
    return DRIFTS[drift].split(": not seen")[0]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The reference: DDP, then FSDP2 (the FSDP2 drift's), in one launch. Each mode builds its
    model from seed 0 and draws its batches from its own rank-seeded generator, so its losses
    do not depend on what trained before it in the process."""
    tmp = tmp_path_factory.mktemp("drift-plain")
    args = ["--modes", "ddp,fsdp2", "--steps", "3", "--out", str(tmp / "plain")]
    run_plain(SCRIPT, args, job_env(), timeout=600)
    return read_outputs(tmp / "plain")


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_a_vanished_private_api_changes_nothing_and_is_said(
    pair: tuple[str, str], plain: list[dict], tmp_path: Path
) -> None:
    env = job_env()
    env["ZEROSCOPE_BOOTSTRAP_HOOKS"] = "tests.drift_hook:install"
    env["ZEROSCOPE_TEST_DRIFT"] = ",".join(pair)
    done = run_zeroscope(SCRIPT, [*ARGS, "--out", str(tmp_path / "zs")], env, tmp_path / "t", 600)
    zs = read_outputs(tmp_path / "zs")
    for rank in range(len(plain)):
        assert zs[rank]["ddp"]["losses"] == plain[rank]["ddp"]["losses"], pair[rank]
    console = done.stdout + done.stderr
    for drift in pair:
        assert DRIFTS[drift] in console, (drift, console[-3000:])
    assert "the backward phase" not in console  # see DRIFTS
    trace = read_trace(tmp_path / "t")
    for rank, drift in enumerate(pair):
        steps = trace[rank].steps
        losses = [float.fromhex(h) for h in plain[rank]["ddp"]["losses"]]
        assert [s.loss for s in steps] == losses, drift
        # Each rank's trace (the Log screen) says its own loss, and not the other rank's where
        # they differ (the Flight Recorder's first read, which finds the dump gone, may be the
        # one at close: its event still leaves with that last batch).
        events = [e.message for e in trace[rank].events]
        for other in pair:
            said = _part(other) and any(f"zeroscope lost {_part(other)}" in m for m in events)
            assert bool(said) == (_part(other) == _part(drift) != ""), (drift, other, events)
        assert all(s.phases.backward is not None for s in steps), drift  # timed all the same
        if drift in ("fr_dump", "group_sequence"):  # what it lost is not shown as measured
            assert all(c.op != "all_reduce" for s in steps for c in s.collectives), drift


# -- FSDP2, DeepSpeed, the HF Trainer: a name their readers rely on gone -------------------------

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 2},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
}
HF_DS_CONFIG = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 2},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "torch_adam": True}},
}
ENGINE_DRIFTS = {
    # drift: (job, what zeroscope must say it lost, whether P/G/O turn NA)
    "fsdp2_param": (
        "fsdp2",
        "fsdp2's memory accounting (P, G, O): not seen "
        "(fsdp2.param._sharded_param_data_before_a_rename gone)",
        True,
    ),
    "deepspeed_zero12": (
        "deepspeed",
        "deepspeed's memory accounting (P, G, O): not seen (deepspeed.zero12.ipg_buffer gone)",
        True,
    ),
    "hf_pre_optimizer_step": (
        "hf",
        "the HF Trainer's optimizer phase: not seen "
        "(the Trainer ended a step without calling on_pre_optimizer_step)",
        False,
    ),
}


def _engine_job(job: str, tmp: Path) -> tuple[Path, list[str]]:
    if job == "fsdp2":
        return SCRIPT, ["--modes", "fsdp2", "--steps", "3"]
    config = tmp / "ds.json"
    if job == "deepspeed":
        config.write_text(json.dumps(DS_CONFIG))
        return JOBS / "deepspeed_train.py", ["--configs", str(config), "--steps", "3"]
    config.write_text(json.dumps(HF_DS_CONFIG))
    args = ["--ds-config", str(config), "--steps", "2", "--workdir", str(tmp / "w")]
    return JOBS / "hf_trainer_train.py", args


def _losses(outputs: dict, job: str) -> list:
    if job == "fsdp2":
        return outputs["fsdp2"]["losses"]
    if job == "deepspeed":
        (run,) = outputs.values()
        return run["losses"]
    return outputs["losses"]


@pytest.mark.parametrize("drift", sorted(ENGINE_DRIFTS))
def test_an_engine_without_a_name_its_reader_relies_on_trains_the_same_and_is_said(
    drift: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    job, said, memory_na = ENGINE_DRIFTS[drift]
    script, args = _engine_job(job, tmp_path)
    env = job_env()
    if job == "fsdp2":  # its reference trained in the module's launch (after DDP)
        plain = request.getfixturevalue("plain")
    else:
        run_plain(script, [*args, "--out", str(tmp_path / "plain")], env, timeout=900)
        plain = read_outputs(tmp_path / "plain")
    env["ZEROSCOPE_BOOTSTRAP_HOOKS"] = "tests.drift_hook:install"
    env["ZEROSCOPE_TEST_DRIFT"] = drift
    done = run_zeroscope(script, [*args, "--out", str(tmp_path / "zs")], env, tmp_path / "t", 900)
    zs = read_outputs(tmp_path / "zs")
    for rank in range(len(plain)):
        assert _losses(zs[rank], job) == _losses(plain[rank], job)
    assert said in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    trace = read_trace(tmp_path / "t")
    for rank in range(len(plain)):
        steps = trace[rank].steps
        assert steps  # the steps are still reported
        events = [e.message for e in trace[rank].events]
        assert any(said.split(": not seen")[0] in m for m in events), events
        for step in steps:
            m = step.memory
            if memory_na:  # never a count that misses what was renamed
                assert (m.params, m.grads, m.optim) == (None, None, None)
            else:
                assert m.params and m.optim
