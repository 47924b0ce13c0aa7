"""Tier 1: the advisor's pieces without a process group.

- preflight (rule 8) against DeepSpeed 0.19.8's own config reader: a batch triad is flagged
  exactly when DeepSpeed refuses it, and the change the advice names is one DeepSpeed accepts;
- a change applied to a raw ds_config (dotted keys, removal);
- advice never exists without evidence; the JSON shape;
- rule 12 against the pipeline telemetry it reads (Hello.parallel, StepReport.pipeline): says
  plainly that the figures are absent on a schema without them, and on a 1F1B run with a bubble
  above the bound names it, priced by (p-1)/(m+p-1);
- the first differing collective of two sequences;
- ``zeroscope advise`` on a ds_config: one line per problem, exit 1; bad input: one line, exit 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from zeroscope.agent.schema import Collective
from zeroscope.state import ClusterState
from zeroscope.state.advice import Advice, Change, preflight
from zeroscope.state.advice.facts import Facts
from zeroscope.state.advice.model import Thresholds
from zeroscope.state.advice.patch import apply_change
from zeroscope.state.advice.rules_run import fp16, pipeline
from zeroscope.state.sequences import first_difference

ROOT = Path(__file__).resolve().parent.parent

TRIADS = [
    # (train_batch_size, micro, accumulation, world size)
    (32, 4, 2, 4),
    (32, 4, 2, 2),  # 4 x 2 x 2 = 16
    (30, 4, None, 2),  # 30 // 8 = 3 -> 24
    (64, None, 2, 3),  # 64 // 6 = 10 -> 60
    (16, None, None, 3),  # 16 // 3 = 5 -> 15
    (None, 4, 3, 2),
    (24, 4, None, 3),
    (48, 3, 4, 4),
]


class _Mpu:
    """What DeepSpeed's config reader asks of an mpu: the data-parallel size."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def deepspeed_accepts(raw: dict[str, Any], world: int) -> bool:
    """DeepSpeed's own config reader at data-parallel size ``world`` (through an mpu, so no
    process group is needed; its rank query is answered as rank 0)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime import config as ds_config

    real = ds_config.dist.get_rank
    ds_config.dist.get_rank = lambda *a, **k: 0  # type: ignore[assignment]
    try:
        ds_config.DeepSpeedConfig(json.loads(json.dumps(raw)), mpu=_Mpu(world))
    except (AssertionError, ValueError) as exc:
        return "batch" not in str(exc).lower() and "train_batch_size" not in str(exc)
    finally:
        ds_config.dist.get_rank = real  # type: ignore[assignment]
    return True


def _raw(tb: int | None, mb: int | None, gas: int | None) -> dict[str, Any]:
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    return {k: v for k, v in zip(keys, (tb, mb, gas)) if v is not None}


@pytest.mark.parametrize(("tb", "mb", "gas", "world"), TRIADS)
def test_preflight_triad_matches_deepspeed(
    tb: int | None, mb: int | None, gas: int | None, world: int
) -> None:
    raw = _raw(tb, mb, gas)
    found = [a for a in preflight(raw, world) if a.rule == "batch_triad"]
    accepted = deepspeed_accepts(raw, world)
    assert bool(found) == (not accepted), (raw, world, found)
    if found:
        (advice,) = found
        assert advice.severity == "error" and advice.evidence
        fixed = apply_change(raw, advice.change.ds_config)
        assert deepspeed_accepts(fixed, world), (fixed, world)
        assert not [a for a in preflight(fixed, world) if a.rule == "batch_triad"]


def test_preflight_pipeline_and_precision() -> None:
    raw = {
        "train_batch_size": 16,
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
        "fp16": {"enabled": True},
        "bf16": {"enabled": True},
    }
    rules = {a.rule: a for a in preflight(raw, 8, pipeline_stages=2)}
    assert rules["pipeline_zero"].change.ds_config == {"zero_optimization.stage": 1}
    assert rules["precision"].severity == "error"
    assert "batch_triad" not in rules  # 16 over dp 4: micro 4, accumulation 1
    staged = {
        a.rule
        for a in preflight(
            {**raw, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}, 2
        )
    }
    assert "offload_param" in staged
    assert {a.rule for a in preflight({"train_batch_size": 8}, 6, pipeline_stages=4)} == {
        "world_size"
    }


def test_apply_change() -> None:
    raw = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "fp16": 1}
    out = apply_change(
        raw,
        {
            "zero_optimization.stage": 2,
            "zero_optimization.offload_param": None,
            "bf16.enabled": True,
            "fp16.enabled": False,
        },
    )
    assert out == {
        "zero_optimization": {"stage": 2},
        "fp16": {"enabled": False},
        "bf16": {"enabled": True},
    }
    assert raw["zero_optimization"]["stage"] == 3  # the original is left alone


def test_no_advice_without_evidence() -> None:
    with pytest.raises(ValueError, match="without evidence"):
        Advice(rule="x", title="t", evidence=(), change=Change(), formula="", confidence="low")
    a = Advice(
        rule="x",
        title="t",
        evidence=("step 2: 5 ms",),
        change=Change({"zero_optimization.stage": 2}),
        formula="f",
        confidence="high",
        saves_ms=1.5,
    )
    d = a.as_dict()
    assert {"rule", "evidence", "change", "saves_bytes", "saves_ms", "confidence"} <= set(d)
    assert d["change"]["text"] == "zero_optimization.stage = 2"


def _pipeline_state(bubble_ranks: dict[int, tuple[int, float, float]], micro: int) -> Facts:
    """A state whose ranks carry pipeline telemetry shaped as the pipeline branch sends it."""
    state = ClusterState()
    for rank, (pp, step_s, busy) in bubble_ranks.items():
        layout = SimpleNamespace(pp=pp, pp_size=2, microbatches=micro)
        actions = [SimpleNamespace(duration_s=busy)]
        rs = state.rank(rank)
        rs.hello = SimpleNamespace(parallel=layout)  # type: ignore[assignment]
        rs.latest = SimpleNamespace(  # type: ignore[assignment]
            step=4, pipeline=SimpleNamespace(step_s=step_s, actions=actions), collectives=[]
        )
    return Facts(state)


def test_pipeline_rule_without_telemetry_says_so() -> None:
    state = ClusterState()
    state.rank(0).hello = SimpleNamespace()  # type: ignore[assignment]
    found = pipeline(Facts(state), Thresholds())
    assert found is not None and not isinstance(found, Advice)
    assert "no pipeline telemetry" in found.missing


def test_pipeline_rule_bubble_above_bound() -> None:
    # 2 stages, 4 micro-batches: bound 1/5 = 20%; each stage busy 50 of 100 ms: bubble 50%.
    facts = _pipeline_state({0: (0, 0.100, 0.050), 1: (1, 0.100, 0.050)}, micro=4)
    found = pipeline(facts, Thresholds())
    assert isinstance(found, Advice), found
    assert found.change.ds_config == {"gradient_accumulation_steps": 8}
    # Twice the micro-batches: the 1F1B bound (p-1)/(m+p-1) = 1/9, worked out by hand here.
    assert found.saves_ms == pytest.approx((0.5 - 1 / 9) * 100)
    unbalanced = pipeline(_pipeline_state({0: (0, 0.1, 0.09), 1: (1, 0.1, 0.03)}, 4), Thresholds())
    assert isinstance(unbalanced, Advice) and "stage 0" in unbalanced.title


def test_first_difference() -> None:
    a = [Collective("all_gather", 64, 2, 0.0, 0.1, 0.0, False, "w0"),
         Collective("all_gather", 64, 2, 0.1, 0.1, 0.0, False, "w1")]  # fmt: skip
    b = [a[0], Collective("all_gather", 64, 2, 0.1, 0.1, 0.0, False, "w2")]
    assert first_difference(a, a) is None
    index, text = first_difference(a, b)  # type: ignore[misc]
    assert index == 1 and "'w1'" in text and "'w2'" in text
    # One sequence ended early: the second collective is where they part, said in words.
    assert first_difference(a, a[:1]) == (
        1,
        "collective #2: all_gather of 64 B 'w1' where the others issued nothing (its sequence ended)",
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zeroscope", "advise", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_preflight_and_bad_input(tmp_path: Path) -> None:
    config = tmp_path / "ds.json"
    config.write_text('{"train_batch_size": 32, // comments as real configs carry\n'
                      '"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}')  # fmt: skip
    done = _cli(str(config), "--world-size", "2", "--json")
    assert done.returncode == 1, done.stderr
    (advice,) = json.loads(done.stdout)
    assert advice["rule"] == "batch_triad"
    assert advice["change"]["ds_config"] == {"gradient_accumulation_steps": 4}
    assert _cli(str(config), "--world-size", "4").returncode == 0
    missing = _cli(str(tmp_path / "nope.zstrace"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    no_world = _cli(str(config))
    assert no_world.returncode == 2 and "--world-size" in no_world.stderr
    half = _cli(str(config), "--world-size", "4", "--per-device-train-batch-size", "4")
    assert half.returncode == 2 and half.stderr.count("\n") == 1, half.stderr


def test_stage3_save_without_gathering_is_reported(tmp_path: Path) -> None:
    """Rule 10's evidence: the engine's save_16bit_model at stage 3 without
    stage3_gather_16bit_weights_on_model_save writes nothing, returns False, and tells the
    agent so (a checkpoint event naming the key)."""
    import torch

    from tests.models import TinyGPT
    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.api import initialize

    tel = RecordingTelemetry()
    set_telemetry(tel)
    try:
        torch.manual_seed(0)
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 3},
        }
        engine, *_ = initialize(model=TinyGPT(), config=config)
        assert engine.save_16bit_model(str(tmp_path)) is False
    finally:
        set_telemetry(None)
    assert not any(tmp_path.iterdir())
    (event,) = [e for e in tel.events if e[0] == "checkpoint"]
    assert "skipped" in event[1] and "stage3_gather_16bit_weights_on_model_save" in event[1]


def _fp16_run(scales: list[float], overflow: list[bool], step_s: float) -> Facts:
    """A 2-rank fp16 run fed through ClusterState as the engine reports it: per step the scale
    after it and whether it overflowed (and was skipped)."""
    from zeroscope.agent import schema

    state = ClusterState()
    config = schema.ConfigSummary(
        stage=2, precision="fp16", dp_world_size=2, initial_scale_power=32
    )
    for rank in (0, 1):
        state.ingest(
            schema.Hello(
                schema_version=schema.SCHEMA_VERSION,
                job_id="j",
                rank=rank,
                world_size=2,
                config=config,
            )
        )
    for i, (scale, over) in enumerate(zip(scales, overflow, strict=True)):
        for rank in (0, 1):
            state.ingest(
                schema.StepReport(
                    rank=rank,
                    step=i + 1,
                    wall_ns=int((i + 1) * step_s * 1e9),
                    duration_s=step_s,
                    loss_scale=scale,
                    overflow=over,
                    skipped=over,
                )
            )
    state.flush()
    return Facts(state)


def test_a_start_up_overflow_storm_is_priced_and_starts_where_the_scale_settled() -> None:
    """20 of 30 steps skipped while the scale halves from 2^32 to 2^12, then 10 applied at 2^12
    (the run of the report: 'advise' said nothing). The answer, from the run's own shape: start
    at 2^12, saving the 20 skipped steps' time once."""
    scales = [2.0 ** (31 - i) for i in range(20)] + [2.0**12] * 10
    overflow = [True] * 20 + [False] * 10
    found = fp16(_fp16_run(scales, overflow, 0.05), Thresholds())
    assert isinstance(found, Advice), found
    assert found.change.ds_config == {"fp16.initial_scale_power": 12}
    assert found.saves_ms == pytest.approx(20 * 50.0 / 30)
    assert "20 of 30 steps" in found.evidence[0]
    # A calibration of a few steps (DeepSpeed's usual start) is not a storm.
    short = [2.0 ** (15 - i) for i in range(3)] + [2.0**12] * 27
    assert fp16(_fp16_run(short, [True] * 3 + [False] * 27, 0.05), Thresholds()) is None


def test_a_memory_saving_reads_as_a_minus_in_decimal_units() -> None:
    from zeroscope.state.advice.rules_memory import fits

    facts = SimpleNamespace(capacity=10_000_000, used=3_020_000, capacity_text="given")
    ok, text = fits(facts, -1_000_000, Thresholds())  # type: ignore[arg-type]
    assert ok and text.startswith("peak use 3.0MB - 1.0MB = 2.0MB of 10.0MB")


def test_negligible_advice_is_listed_but_not_headlined() -> None:
    from zeroscope.state.advice import HEADLINE_MIN_GAIN, Advisory

    def priced(gain: float) -> Advice:
        return Advice(
            rule="x",
            title="t",
            evidence=("e",),
            change=Change(),
            formula="f",
            confidence="high",
            gain=gain,
        )

    tiny = priced(0.04 / 17)  # the demo's: 0.04 ms of a 17 ms step
    assert tiny.gain < HEADLINE_MIN_GAIN
    assert Advisory([tiny]).headline is None and Advisory([tiny]).top is tiny
    worth = priced(2.0 / 17)
    assert Advisory([worth, tiny]).headline is worth
    unpriced = priced(float("-inf"))
    assert Advisory([unpriced]).headline is unpriced


def _buckets_run(quick_newest: bool, descheduled: int | None) -> Facts:
    """A 2-rank stage-2 bf16 run, reduce_bucket_size 200, 10 steps of 100 ms (one of 1 s when
    ``descheduled``): per step 11 reduce-scatters of 128 B and one of 64 KB, 1 ms each and all
    waited for (latency-bound: the 64 KB one is as quick as the small ones); the newest step's
    take 0.2 ms each when ``quick_newest``."""
    from zeroscope.agent import schema

    state = ClusterState()
    config = schema.ConfigSummary(
        stage=2, precision="bf16", dp_world_size=2, reduce_bucket_size=200
    )
    for rank in (0, 1):
        state.ingest(
            schema.Hello(
                schema_version=schema.SCHEMA_VERSION, job_id="j", rank=rank, world_size=2,
                config=config,
            )
        )  # fmt: skip
    end_s = 0.0
    for step in range(1, 11):
        each = 0.0002 if quick_newest and step == 10 else 0.001
        sizes = [128] * 11 + [65536]
        end_s += 1.0 if step == descheduled else 0.1
        for rank in (0, 1):
            state.ingest(
                schema.StepReport(
                    rank=rank,
                    step=step,
                    wall_ns=int(end_s * 1e9),
                    duration_s=1.0 if step == descheduled else 0.1,
                    collectives=[
                        Collective(
                            op="reduce_scatter", nbytes=n, group_size=2, start_s=0.01 * i,
                            duration_s=each, exposed_s=each,
                        )
                        for i, n in enumerate(sizes)
                    ],
                )
            )  # fmt: skip
    state.flush()
    return Facts(state)


def test_the_bucket_rule_prices_the_typical_step_not_the_newest_or_a_descheduled_one() -> None:
    """The saving is each steady step's (the reference rank's) against that step's own length,
    the median deciding: a newest step whose reductions happened to be quick and a step whose
    rank was descheduled for a second (which drags the cluster's mean step up) do not silence
    a rule whose typical step spends 12 ms of 100 in 12 latency-bound reductions. By hand:
    n' = 2 buckets at the newest step's median alpha 0.2 ms, plus the bytes at its best rate
    (64 KB in 0.2 ms, on the wire S (N-1)/N: 32 KB / 0.2 ms); every step's 12 ms less that."""
    from zeroscope.state.advice.rules_comm import buckets

    wire = (11 * 128 + 65536) / 2
    after = 2 * 0.0002 + wire / (32768 / 0.0002)
    expected_ms = (0.012 - after) * 1e3  # the typical step's saving (all of it waited for)
    for quick, descheduled in ((False, None), (True, None), (True, 5)):
        found = buckets(_buckets_run(quick, descheduled), Thresholds())
        assert len(found) == 1, (quick, descheduled)
        (advice,) = found
        assert isinstance(advice, Advice) and advice.rule == "buckets"
        if quick:
            assert advice.saves_ms == pytest.approx(expected_ms)
        assert advice.change.ds_config["zero_optimization.reduce_bucket_size"] == (
            (11 * 128 + 65536) // 2 // 2
        )


def _prefetch_run(quick_newest: bool) -> Facts:
    """A 2-rank stage-3 fp32 run with prefetch off (bucket 0), 100,000 parameters in layers of
    10,000, 10 steps of 100 ms: per step 10 all-gathers of 5 ms, all waited for, and a forward
    of 40 ms plus a backward of 50 ms (phases include the waits: 40 ms of compute around 50 ms
    of fetches). When ``quick_newest``, the newest step's gathers take 0.5 ms and its forward
    and backward 10 ms each."""
    from zeroscope.agent import schema

    state = ClusterState()
    config = schema.ConfigSummary(
        stage=3, precision="fp32", dp_world_size=2, prefetch_bucket_size=0
    )
    params = schema.ParamCounts(total=100_000, trainable=100_000, largest_layer=10_000)
    for rank in (0, 1):
        state.ingest(
            schema.Hello(
                schema_version=schema.SCHEMA_VERSION, job_id="j", rank=rank, world_size=2,
                config=config, params=params,
            )
        )  # fmt: skip
    for step in range(1, 11):
        quick = quick_newest and step == 10
        each = 0.0005 if quick else 0.005
        phases = (
            schema.Phases(forward=0.01, backward=0.01)
            if quick
            else schema.Phases(forward=0.04, backward=0.05)
        )
        for rank in (0, 1):
            state.ingest(
                schema.StepReport(
                    rank=rank, step=step, wall_ns=int(step * 0.1 * 1e9), duration_s=0.1,
                    phases=phases,
                    collectives=[
                        Collective(
                            op="all_gather", nbytes=40_000, group_size=2, start_s=0.009 * i,
                            duration_s=each, exposed_s=each,
                        )
                        for i in range(10)
                    ],
                )
            )  # fmt: skip
    state.flush()
    return Facts(state)


def test_the_prefetch_rule_prices_the_typical_step_not_the_newest() -> None:
    """Each steady step's saving is priced with its own fetch wait and its own forward/backward
    compute, the median deciding: a newest step that happened to be quick (its 20 ms of
    phases set against the typical 50 ms wait read as no compute at all) no longer prices the
    advice at 0 (the old rule did). By hand, the typical step: compute to hide behind
    90 - 50 = 40 ms; the quick newest step's gathers give alpha 0.5 ms, k = 2 layers, the
    unhideable first fetch 0.5 ms; saving (50 - 0.5 - 2 x 0.5) - max(0, 50 - 40) = 38.5 ms."""
    from zeroscope.state.advice.rules_comm import prefetch

    # Without the quick step: alpha 5 ms, 4 ms of compute per fetch, k = 3 layers, the first
    # fetch 5 ms: (50 - 5 - 3 x 5) - 10 = 20 ms.
    for quick, layers, saves_ms in ((False, 3, 20.0), (True, 2, 38.5)):
        advice = prefetch(_prefetch_run(quick), Thresholds())
        assert isinstance(advice, Advice) and advice.rule == "prefetch", quick
        bucket = advice.change.ds_config["zero_optimization.stage3_prefetch_bucket_size"]
        assert bucket == layers * 10_000
        assert advice.saves_ms == pytest.approx(saves_ms), quick


def test_the_batch_triad_is_judged_only_for_engines_that_have_one() -> None:
    """A plain DDP job reports no batch sizes (the schema's defaults: 1, 1, 1): the rule read
    them as a ds_config and gave an ERROR on a new user's compiled DDP trace."""
    from zeroscope.agent import schema
    from zeroscope.state.advice.rules_run import batch_triad

    config = schema.ConfigSummary(stage=0, precision="fp32", dp_world_size=2)
    for engine, judged in (("ddp", False), ("fsdp2", False), ("deepspeed", True), ("", True)):
        state = ClusterState()
        for rank in (0, 1):
            state.ingest(
                schema.Hello(
                    schema_version=schema.SCHEMA_VERSION, job_id="j", rank=rank, world_size=2,
                    config=config, engine=engine,
                )
            )  # fmt: skip
        found = batch_triad(Facts(state), Thresholds())
        assert (found is not None) == judged, engine


def _hf_filled(raw: dict[str, Any], world: int, per_device: int, accumulation: int) -> Any:
    """transformers' own DeepSpeed config of ``raw`` for a Trainer of those values on
    ``world`` ranks (the oracle of preflight's ``trainer``)."""
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    class Args(TrainingArguments):
        @property
        def world_size(self) -> int:
            return world

    args = Args(
        output_dir="unused",
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        report_to=[],
    )
    hf = HfTrainerDeepSpeedConfig(json.loads(json.dumps(raw)))
    hf.trainer_config_process(args)
    return hf


HF_ZERO3 = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
}
"""The shape of the Hugging Face documentation's ZeRO-3 ds_config: every batch key "auto"."""


@pytest.mark.parametrize(
    ("given", "trainer"),
    [
        ({}, (4, 2)),
        ({"gradient_accumulation_steps": 2}, (4, 2)),
        ({"train_micro_batch_size_per_gpu": 8}, (4, 2)),  # the Trainer refuses the mismatch
        ({"train_batch_size": 48}, (3, 2)),
    ],
)
def test_a_hugging_face_config_is_checked_as_the_trainer_fills_it(
    given: dict[str, Any], trainer: tuple[int, int]
) -> None:
    """Its "auto" batch keys are no error (the Trainer fills them; preflight said to remove
    them, which leaves the Trainer nothing to fill): with the Trainer's values preflight
    checks the config the Trainer makes, and a number the Trainer would refuse is an error."""
    raw, world = {**HF_ZERO3, **given}, 8
    alone = preflight(raw, world)
    assert [a.severity for a in alone if a.rule == "auto"] == ["advice"]
    assert not any(a.severity == "error" for a in alone), alone
    hf = _hf_filled(raw, world, *trainer)
    found = preflight(raw, world, trainer=trainer)
    refused = [a for a in found if a.rule == "auto" and a.severity == "error"]
    assert len(refused) == len(hf.mismatches), (found, hf.mismatches)
    if not hf.mismatches:  # what the Trainer hands DeepSpeed, accepted by DeepSpeed
        filled = {k: hf.config[k] for k in _raw(1, 1, 1)}
        assert deepspeed_accepts(filled, world)
        assert not [a for a in found if a.rule in ("auto", "batch_triad")], found
