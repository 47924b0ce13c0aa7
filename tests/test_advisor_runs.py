"""Tier 3: the advisor on real runs of the bundled engine (2 gloo CPU ranks, tiny models, a few
steps) where the right advice is known, and the closed loop (``zeroscope advise --verify``) that
applies the top change and measures it.

One process-group launch records every baseline run (tests/jobs/advice_job.py, each to its own
recording collector); each verify is a real ``zeroscope run`` of the same job with the change
applied. Known answers:

- a tiny model on ZeRO-3 (every parameter gathered): lower the stage (saves time, costs memory);
- fp16 with a loss spike every other step: bf16 (saves the skipped steps' time);
- activations dominating a nearly full device: activation checkpointing (saves bytes);
- ZeRO-3 with stage3_prefetch_bucket_size 1 on a device where stage 2 does not fit: a larger
  prefetch bucket (saves fetch wait);
- a rank that runs its blocks in another order at step 3: divergence naming rank 1, step 3;
- stage 2 with a 200-element reduce bucket on 16 blocks: larger buckets.

For the memory and time rules (stage, fp16, activations), the trial must move the predicted figure
in the predicted direction by at least half the predicted amount: figures the agent measured in
both runs (the all-gather wait, skipped share, engine bytes), never a clock in the test. The
prefetch rule's trial is not asserted here: hiding fetches needs the gathers to progress while the
loop computes, which gloo on an oversubscribed 2-core host does not do (measured: prefetched 16 KB
gathers taking 10-30 ms each against 0.01-2 ms when waited for); the rule says so (low
confidence off CUDA).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.distributed import run_ranks
from zeroscope.agent.schema import Bye
from zeroscope.collector.server import Collector, wait_for
from zeroscope.commands.summary import state_of
from zeroscope.state.advice import advise
from zeroscope.state.advice.facts import Facts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "advice_job.py"
BF16 = {"bf16": {"enabled": True}}
ADAM = {"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}

JOBS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (ds_config, advice_job flags)
    "zero3": (
        # A small model on ZeRO-3 with the memory-saving knobs common in published configs
        # (the Hugging Face "auto" persistence and prefetch values for hidden size 64, nothing
        # kept live or reused): every block's weights are gathered, and waited for, in forward
        # and again in backward.
        {
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 640,
                "stage3_prefetch_bucket_size": 3686,
                "stage3_max_live_parameters": 0,
                "stage3_max_reuse_distance": 0,
            },
            **BF16,
        },
        {"steps": 8, "width": 64, "layers": 16, "seq": 1},
    ),
    "fp16": (
        {"zero_optimization": {"stage": 1}, "fp16": {"enabled": True}},
        {"steps": 10, "spike_every": 2},
    ),
    "activations": (
        {"zero_optimization": {"stage": 1}, **BF16},
        {"steps": 6, "layers": 6, "seq": 64},
    ),
    "prefetch": (
        # The small model of "zero3" with prefetch off (bucket 0) and no reuse: each of its 32
        # block weights is fetched only when its layer runs, one latency-bound all-gather at a
        # time; a prefetch window coalesces them. On a device where ZeRO-3 is needed (the test
        # gives its memory).
        {
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 640,
                "stage3_prefetch_bucket_size": 0,
                "stage3_max_reuse_distance": 0,
            },
            **BF16,
        },
        {"steps": 10, "width": 64, "layers": 16, "seq": 1},
    ),
    "divergent": (
        {
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "stage3_prefetch_bucket_size": 0,
                # Every rank gathers and releases by module order alone (no trace-driven
                # prefetch or reuse), so the reordered step still pairs collectives up.
                "stage3_max_reuse_distance": 0,
            },
            **BF16,
        },
        {"steps": 5, "diverge_rank": 1, "diverge_step": 3},
    ),
    "buckets": (
        # 16 blocks: 48 latency-bound reduce-scatters per step where 2 buckets would do. With
        # 4 blocks (12 of them) the saving was 6-24% of the step on a quiet machine over 8 runs,
        # against the rule's 5%: the verdict then hung on the machine's noise; with 16 it was
        # 16-29% over 6 runs.
        {"zero_optimization": {"stage": 2, "reduce_bucket_size": 200}, **BF16},
        {"steps": 6, "layers": 16},
    ),
}
MICRO = {"activations": 8, "zero3": 1}


def _config(name: str) -> dict[str, Any]:
    zero, _ = JOBS[name]
    return {"train_micro_batch_size_per_gpu": MICRO.get(name, 4), **ADAM, **zero}


def _flags(name: str) -> list[str]:
    out = []
    for key, value in JOBS[name][1].items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def _train(rank: int, world: int, jobs: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    from tests.jobs.advice_job import train
    from zeroscope.agent import api

    for name, address, config, flags in jobs:
        os.environ[api.COLLECTOR_ENV] = address
        os.environ["ZEROSCOPE_JOB_ID"] = name
        api.set_telemetry(None)
        train(config, **flags)
        api.telemetry().close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every baseline job, recorded: name -> trace (its ds_config beside it, name.json)."""
    folder = tmp_path_factory.mktemp("advice")
    traces, collectors, byes = {}, [], {}
    specs = []
    for name in JOBS:
        config = folder / f"{name}.json"
        config.write_text(json.dumps(_config(name)))
        traces[name] = folder / f"{name}.zstrace"
        col = Collector(record=traces[name])
        byes[name] = []
        col.add_listener(lambda m, n=name: byes[n].append(m) if isinstance(m, Bye) else None)
        col.__enter__()
        collectors.append(col)
        specs.append((name, col.ingest_address, str(config), JOBS[name][1]))
    try:
        run_ranks(_train, 2, specs, timeout=900)
        for name in JOBS:
            assert wait_for(lambda n=name: len(byes[n]) == 2, 30), name  # type: ignore[misc]
    finally:
        for col in collectors:
            col.__exit__(None, None, None)
    return traces


def _top(trace: Path, capacity: int | None = None) -> Any:
    state, _ = state_of(trace)
    advisory = advise(state, capacity=capacity)
    assert advisory.advice, [n.as_dict() for n in advisory.not_judged]
    return advisory.advice[0], state


def _stage2_extra(state: Any) -> float:
    """Bytes stage 2 would add per rank, by hand from the paper (not the formulas the advisor
    uses): stage 2 holds the whole parameter set, bΨ (b = 2 bytes in 16-bit, 4 in fp32), where
    stage 3 holds its shard plus the persistent parameters whole, b(Ψ/N + persistent); G and O
    are sharded alike at both stages."""
    c, p = state.config, state.params
    b = 4 if c.precision == "fp32" else 2
    return b * p.total - b * (p.total / c.dp_world_size + p.persistent)


def tight_capacity(trace: Path) -> int:
    """A device just large enough for the run as measured (95% full)."""
    state, _ = state_of(trace)
    used = Facts(state).used
    assert used
    return int(used / 0.95)


def _gathers_hidden(trace: Path) -> str:
    """Why the run is no case for lowering the stage, by the rule's own threshold ("" when it
    is one): the all-gathers' exposed share of the step, measured by the agent. Idle, the job
    reads 33-57 %; once a busy CI machine slowed both ranks alike, 14 % (16 ms of a 117 ms
    step: the waits for the peer shrank while compute grew), and the advisor rightly put
    prefetch first."""
    state, _ = state_of(trace)
    f = Facts(state)
    share = f.op("all_gather").exposed / f.step_s if f.step_s else 0.0
    floor = state.rules.advice.exposed_share_min
    if share >= floor:
        return ""
    assert all(a.rule != "stage" for a in advise(state).advice)  # the rule declines, as it says
    return f"all-gathers exposed {share:.0%} of the step here, under the rule's {floor:.0%}"


def test_zero3_tiny_model_lower_the_stage(runs: dict[str, Path]) -> None:
    hidden = _gathers_hidden(runs["zero3"])
    if hidden:
        pytest.skip(hidden)
    top, state = _top(runs["zero3"])
    assert top.rule == "stage", top
    assert top.change.ds_config["zero_optimization.stage"] == 2
    assert top.saves_ms > 0 and top.saves_bytes < 0
    assert top.saves_bytes == pytest.approx(-_stage2_extra(state))


def test_fp16_overflow_storm_bf16(runs: dict[str, Path]) -> None:
    top, state = _top(runs["fp16"])
    assert top.rule == "fp16", top
    assert top.change.ds_config == {"bf16.enabled": True, "fp16.enabled": False}
    # 5 of the 10 steps overflowed (steps 2, 4, ... 10): half the mean step is wasted.
    assert top.saves_ms == pytest.approx(0.5 * state.totals.mean_step_s * 1e3)


def test_activations_dominating_checkpoint(runs: dict[str, Path]) -> None:
    top, _state = _top(runs["activations"], tight_capacity(runs["activations"]))
    assert top.rule == "activations", top
    assert top.saves_bytes > 0 and top.saves_ms < 0
    assert "6 repeated blocks" in top.change.code


def test_prefetch_far_too_small(runs: dict[str, Path]) -> None:
    state, _ = state_of(runs["prefetch"])
    used = Facts(state).used
    assert used
    # A device where ZeRO-3 is needed: stage 2's extra bytes do not fit under 80% of it.
    capacity = int((used + _stage2_extra(state) / 2) / 0.8)
    top, _ = _top(runs["prefetch"], capacity)
    assert top.rule == "prefetch", top
    assert top.saves_ms > 0 and top.saves_bytes <= 0
    assert top.change.ds_config["zero_optimization.stage3_prefetch_bucket_size"] > 1


def test_divergent_rank_named(runs: dict[str, Path]) -> None:
    top, _ = _top(runs["divergent"])
    assert (top.rule, top.severity, top.ranks) == ("divergence", "error", (1,)), top
    assert top.evidence[0].startswith("step 3: rank 1 ")
    assert "blocks.3." in top.evidence[1] and "blocks.0." in top.evidence[1], top.evidence


def test_small_buckets(runs: dict[str, Path]) -> None:
    state, _ = state_of(runs["buckets"])
    found = [a for a in advise(state).advice if a.rule == "buckets"]
    assert found, advise(state)
    assert found[0].saves_ms > 0
    assert found[0].change.ds_config["zero_optimization.reduce_bucket_size"] > 200


def verify(runs: dict[str, Path], name: str, *extra: str, capacity: int | None = None) -> dict:
    """``zeroscope advise TRACE --json --verify -- <the job's command>``; the trial's JSON."""
    config = runs[name].with_suffix(".json")
    cmd = [sys.executable, "-m", "zeroscope", "advise", str(runs[name]), "--json"]
    if capacity:
        cmd += ["--device-memory", str(capacity)]
    cmd += ["--verify", "--", "--nproc-per-node", "2", str(JOB), "--deepspeed_config",
            str(config), *_flags(name), *extra]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    trial = json.loads(done.stdout)
    # Shown with -rP, and on failure: the advice against the measured outcome.
    print(name, json.dumps(trial["advice"]), json.dumps(trial["checks"]))
    assert Path(trial["trial_trace"]).exists(), time.monotonic() - started
    return trial


def _held(trial: dict, metric: str) -> dict:
    (check,) = [c for c in trial["checks"] if c["metric"] == metric]
    assert check["holds"], trial["checks"]
    return check


def test_verify_lower_stage(runs: dict[str, Path]) -> None:
    hidden = _gathers_hidden(runs["zero3"])
    if hidden:
        pytest.skip(hidden)
    trial = verify(runs, "zero3")
    assert trial["advice"]["rule"] == "stage"
    assert json.loads(Path(trial["config"]).read_text())["zero_optimization"]["stage"] == 2
    assert _held(trial, "fetch_wait_ms")["predicted"] > 0
    assert _held(trial, "model_state_bytes")["predicted"] < 0


def test_verify_bf16(runs: dict[str, Path]) -> None:
    trial = verify(runs, "fp16")
    assert trial["advice"]["rule"] == "fp16"
    check = _held(trial, "skipped_ms")
    assert check["after"] == 0


def test_verify_activation_checkpointing(runs: dict[str, Path]) -> None:
    trial = verify(
        runs, "activations", "--checkpoint", capacity=tight_capacity(runs["activations"])
    )
    assert trial["advice"]["rule"] == "activations" and trial["config"] is None
    assert _held(trial, "activation_bytes")["predicted"] > 0
