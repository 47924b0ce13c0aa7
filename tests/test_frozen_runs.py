"""A LoRA fine-tune (PEFT on a tiny Llama from a config: 1,024 trainable of 25,760 parameters)
under ``zeroscope run --headless --record`` on 2 CPU ranks: real DeepSpeed at ZeRO-1/2/3 (bf16),
the bundled engine as DeepSpeed (``--as-deepspeed``, same script, same configs) and FSDP2
(fp32). The same script also runs under bare torchrun. FSDP2 trains first in the same launch as
real DeepSpeed (four launches in all, not six: a launch's cost is its ranks' start-up); the
step numbers run on through the whole launch, and each engine's steps are read from its own
stretch of them.

Oracles: the run without zeroscope (losses bit for bit); the model's own parameter list (each
parameter's size and whether it is trainable, written by the script before any engine touched
it) with each engine's partitioning rules as formulas below; and the ZeRO formulas with Ψ split
into trainable and frozen (zeroscope.state.formulas), which must give the same P (and, where
the engine keeps nothing beyond the paper's parts, the same G and O).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attach_support import (
    JOBS,
    job_env,
    read_outputs,
    read_trace,
    run_plain,
    run_zeroscope,
    segments,
)
from zeroscope.run.as_deepspeed import alias_environment
from zeroscope.state import units
from zeroscope.state.formulas import model_state_bytes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SCRIPT = JOBS / "lora_train.py"
N = 2
STEPS = 3
BUCKET = 2048
STAGES = (1, 2, 3)


def _config(stage: int) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 4,
        # Stage 3: no persistent parameters, so each rank holds exactly one shard of each.
        "zero_optimization": {
            "stage": stage,
            "stage3_param_persistence_threshold": 0,
            "reduce_bucket_size": BUCKET,
        },
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    }


def _launch(tmp: Path, name: str, args: list[str], env: dict[str, str]) -> dict:
    """One launch, bare and under zeroscope: per rank its records (one per engine run, in the
    order the script trained them), its Hellos, and its steps cut into those runs (which
    asserts the step numbers run on, 1 to the launch's last, through every engine)."""
    run_plain(SCRIPT, [*args, "--out", str(tmp / f"{name}-plain")], env, timeout=1200)
    trace = tmp / f"{name}.zstrace"
    done = run_zeroscope(SCRIPT, [*args, "--out", str(tmp / f"{name}-zs")], env, trace, 1200)
    zs = [list(r.values()) for r in read_outputs(tmp / f"{name}-zs")]
    ranks = read_trace(trace)
    return {
        "plain": [list(r.values()) for r in read_outputs(tmp / f"{name}-plain")],
        "zs": zs,
        "hellos": [ranks[r].hellos for r in range(N)],
        "segments": [segments(ranks[r].steps, [STEPS] * len(zs[r])) for r in range(N)],
        "launch_steps": [ranks[r].steps for r in range(N)],
        "trace_path": trace,
        "stdout": done.stdout,
    }


PER_RUN = ("plain", "zs", "hellos", "segments")


def _part(launch: dict, start: int, stop: int | None = None) -> dict:
    """The engine runs ``start:stop`` of a launch, as if they had been a launch of their own
    (the launch's own trace, stdout and steps stay whole)."""
    part = {key: [rank[start:stop] for rank in launch[key]] for key in PER_RUN}
    return {**launch, **part}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("lora")
    paths = []
    for stage in STAGES:
        path = tmp / f"zero{stage}.json"
        path.write_text(json.dumps(_config(stage)))
        paths.append(str(path))
    ds_args = ["--configs", ",".join(paths), "--steps", str(STEPS)]
    env = job_env()
    fsdp2_then_deepspeed = _launch(tmp, "deepspeed", ["--fsdp2", *ds_args], env)
    return {
        "fsdp2": _part(fsdp2_then_deepspeed, 0, 1),
        "deepspeed": _part(fsdp2_then_deepspeed, 1),
        "bundled": _launch(tmp, "bundled", ds_args, alias_environment(env)),
    }


def _steps(run: dict, rank: int, index: int) -> list:
    return run["segments"][rank][index]


def _sizes(record: dict) -> tuple[list[int], list[int]]:
    """(trainable, frozen) parameter sizes, in the module's order."""
    params = record["params"]
    return [n for n, t in params if t], [n for n, t in params if not t]


def _shard(sizes: list[int]) -> int:
    """Elements of one rank's shards when each parameter is split alone into N chunks (ZeRO-3's
    partition_parameters.py, the bundled stage 3, FSDP2's dim-0 shards of these shapes)."""
    return sum(math.ceil(n / N) for n in sizes)


def _expected(engine: str, stage: int, record: dict) -> dict[str, int]:
    """P, frozen P, G, O one rank holds, from the model's list and the engine's rules."""
    b = record["element_size"]
    trainable, frozen = _sizes(record)
    t, f = sum(trainable), sum(frozen)
    if stage == 3:
        p, fp = b * _shard(trainable + frozen), b * _shard(frozen)
        grads = b * _shard(trainable)
        if engine == "deepspeed":  # plus its reduce bucket (reduce_bucket_size elements)
            grads += b * BUCKET
        if engine == "fsdp2":  # fp32: the parameters are the master; AdamW's step scalars
            optim = 8 * _shard(trainable) + 4 * len(trainable)
        else:  # fp32 master + m + v of the shard (+ DeepSpeed's 4-byte step per group)
            optim = 12 * _shard(trainable) + (4 if engine == "deepspeed" else 0)
        return {"params": p, "frozen": fp, "grads": grads, "optim": optim}
    # Stages 1-2: the trainable parameters in one flat group (DeepSpeed pads it to 2N, the
    # bundled engine to N: 1,024 needs neither); the frozen ones whole in the module.
    if engine == "deepspeed":
        grads = b * t // N  # the reduced gradients of its partition (whole parameters here)
        optim = 12 * t // N + 4
    else:
        grads = b * t if stage == 1 else b * t // N
        optim = 12 * t // N
    return {"params": b * (t + f), "frozen": b * f, "grads": grads, "optim": optim}


CASES = [("deepspeed", s) for s in STAGES] + [("bundled", s) for s in STAGES] + [("fsdp2", 3)]


def _index(engine: str, stage: int) -> int:
    return 0 if engine == "fsdp2" else STAGES.index(stage)


@pytest.mark.parametrize(("engine", "stage"), CASES)
def test_p_holds_every_parameter_g_and_o_only_the_trainable(
    runs: dict, engine: str, stage: int
) -> None:
    run = runs[engine]
    for rank in range(N):
        record = run["zs"][rank][_index(engine, stage)]
        want = _expected(engine, stage, record)
        assert want["frozen"] > 20 * (want["params"] - want["frozen"])  # LoRA: mostly frozen
        for step in _steps(run, rank, _index(engine, stage)):
            m = step.memory
            got = {"params": m.params, "frozen": m.frozen_params, "grads": m.grads}
            assert {**got, "optim": m.optim} == want, (engine, stage, rank, step.step)
            assert (m.host_params, m.host_grads, m.host_optim) == (0, 0, 0)
        hello = run["hellos"][rank][_index(engine, stage)]
        trainable, frozen = _sizes(record)
        assert (hello.params.total, hello.params.trainable) == (
            sum(trainable) + sum(frozen),
            sum(trainable),
        )


@pytest.mark.parametrize(("engine", "stage"), CASES)
def test_the_estimate_reproduces_the_measured_bytes(runs: dict, engine: str, stage: int) -> None:
    run = runs[engine]
    record = run["zs"][0][_index(engine, stage)]
    hello = run["hellos"][0][_index(engine, stage)]
    c, p = hello.config, hello.params
    assert (c.stage, c.dp_world_size) == (stage, N)
    predicted = model_state_bytes(p.total, N, stage, c.precision, trainable=p.trainable)
    m = _steps(run, 0, _index(engine, stage))[-1].memory
    assert m.params == predicted.params  # every engine: P is Ψ's bytes (sharded at stage 3)
    if engine != "deepspeed":  # DeepSpeed adds its reduce bucket, step counters, stage-1 G/N
        extra = 4 * len(_sizes(record)[0]) if engine == "fsdp2" else 0  # AdamW step scalars
        assert (m.grads, m.optim) == (predicted.grads, predicted.optim + extra)
    # `zeroscope estimate --trainable` prints the same P.
    argv = [sys.executable, "-m", "zeroscope", "estimate", "--params", str(p.total)]
    argv += ["--trainable", str(p.trainable), "--ranks", str(N), "--stage", str(stage)]
    argv += ["--precision", c.precision]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1].split()[1] == units.size(m.params)


@pytest.mark.parametrize("engine", ["deepspeed", "bundled", "fsdp2"])
def test_losses_are_bit_identical_with_and_without_zeroscope(runs: dict, engine: str) -> None:
    run = runs[engine]
    for rank in range(N):
        for index, (zs, plain) in enumerate(zip(run["zs"][rank], run["plain"][rank])):
            assert zs["losses"] == plain["losses"]
            steps = _steps(run, rank, index)
            assert [s.loss for s in steps] == [float.fromhex(h) for h in plain["losses"]]


def test_the_step_line_and_summary_show_the_frozen_share(runs: dict) -> None:
    run = runs["deepspeed"]
    m = _steps(run, 0, 0)[-1].memory
    shown = f"P {units.params_size(m.params, m.frozen_params)} G"
    assert "(frozen " in shown and shown in run["stdout"]
    argv = [sys.executable, "-m", "zeroscope", "summary", "--json", str(run["trace_path"])]
    summary = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    peaks = [r["frozen_params_peak"] for r in summary["ranks"]]
    # The summary reads the whole launch's trace (FSDP2's steps too): its peak is theirs all.
    frozen = [max(s.memory.frozen_params for s in run["launch_steps"][r]) for r in range(N)]
    assert peaks == frozen and summary["total"]["frozen_params_peak"] == max(frozen)
