"""Tokens/s, TFLOP/s and MFU from their parts: the wire (old traces still decode), the state's
definitions against hand arithmetic, NA with the reason, the agent's token and FLOP meter on
inputs of every kind, and the peak table and probe."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest
import torch

from tests.throughput_support import KnownGPT, closed_form
from zeroscope.agent import peak as peak_mod
from zeroscope.agent import work as work_mod
from zeroscope.agent.peak import PeakProbe, datasheet_peak, measure_matmul
from zeroscope.agent.schema import SCHEMA_VERSION, Hello, Phases, StepReport, Work, decode, encode
from zeroscope.agent.work import WorkMeter, work_report
from zeroscope.state import ClusterState, units
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.state.report import run_report
from zeroscope.state.throughput import cluster_step, predicted_flops, rank_step


@pytest.fixture(autouse=True)
def _counting_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FLOP count is on unless ZEROSCOPE_FLOPS=0; these tests are about what it counts."""
    monkeypatch.delenv(work_mod.FLOPS_ENV, raising=False)


BASE_NS = 1_700_000_000 * 10**9


def _work(**kw: object) -> Work:
    fields: dict[str, object] = dict(
        tokens=100,
        positions=128,
        seq_len=64,
        flops=4e12,
        peak_flops=1e14,
        peak_source="datasheet H100 bf16 dense",
        dense_params=1000,
        layers=2,
        hidden=16,
    )
    fields.update(kw)
    return Work(**fields)  # type: ignore[arg-type]


def _report(rank: int, step: int, duration: float, work: Work | None) -> StepReport:
    return StepReport(
        rank=rank, step=step, wall_ns=BASE_NS + step * 10**9, duration_s=duration, work=work
    )


def _state(world: int) -> ClusterState:
    state = ClusterState()
    for rank in range(world):
        state.ingest(Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=rank, world_size=world))
    return state


def test_a_report_without_work_decodes_as_before() -> None:
    # A StepReport from before the field existed: its encoding has no "work" key at all.
    old = _report(0, 1, 1.0, None)
    data = encode(old)
    assert b"work" not in data
    assert decode(data) == old and decode(data).work is None  # type: ignore[union-attr]
    new = _report(0, 1, 1.0, _work())
    assert decode(encode(new)) == new
    # And a new one's extra field is ignored by a decoder that does not know it.
    assert msgspec.msgpack.decode(encode(new))["work"]["tokens"] == 100


def test_rank_and_cluster_figures_by_hand() -> None:
    state = _state(2)
    state.ingest(_report(0, 1, 2.0, _work()))
    (agg,) = state.ingest(_report(1, 1, 4.0, _work(tokens=60, flops=2e12, peak_flops=3e14)))
    r0 = rank_step(agg.summaries[0])
    assert r0.tokens_per_s == 50.0 and r0.tflops_per_s == 2.0
    assert r0.mfu == pytest.approx(4e12 / 2.0 / 1e14)
    c = cluster_step(agg)  # the step lasts as long as its slowest rank: 4 s
    assert c.tokens_per_s == 160 / 4.0 and c.tflops_per_s == pytest.approx(6e12 / 4.0 / 1e12)
    assert c.mfu == pytest.approx(6e12 / (4.0 * 4e14)) and c.peak_tflops == 400.0
    # 6·N·T + 12·L·h·s·T on the positions computed (padding included).
    assert predicted_flops(_work()) == 6 * 1000 * 128 + 12 * 2 * 16 * 64 * 128
    assert "tok/s 40" in step_line(agg) and "MFU 0.38%" in step_line(agg)


def test_an_evaluation_in_a_step_is_out_of_its_rates() -> None:
    # Rank 1's step holds a 3 s evaluation before its 1 s of training (the eval phase): its
    # counted work (training forwards and backwards) is over the 1 s, as are the cluster's,
    # whose training time is its slowest rank's less that rank's evaluation: max(2, 4 - 3).
    state = _state(2)
    state.ingest(_report(0, 1, 2.0, _work()))
    late = _report(1, 1, 4.0, _work(tokens=60, flops=2e12, peak_flops=3e14))
    late.phases = Phases(forward=0.5, backward=0.5, eval=3.0)
    (agg,) = state.ingest(late)
    r1 = rank_step(agg.summaries[1])
    assert r1.tokens_per_s == 60 / 1.0 and r1.tflops_per_s == pytest.approx(2.0)
    c = cluster_step(agg)
    assert c.tokens_per_s == 160 / 2.0 and c.mfu == pytest.approx(6e12 / (2.0 * 4e14))
    assert "(eval 3.00s)" in step_line(agg) and "tok/s 80" in step_line(agg)


def test_run_figures_leave_the_first_step_out() -> None:
    state = _state(1)
    for step, seconds in ((1, 9.0), (2, 1.0), (3, 3.0)):
        state.ingest(_report(0, step, seconds, _work()))
    out = run_report(state)
    assert out["tokens_per_s"] == pytest.approx(200 / 4.0)
    assert out["tflops_per_s"] == pytest.approx(8e12 / 4.0 / 1e12)
    assert out["mfu"] == pytest.approx(8e12 / (4.0 * 1e14))
    assert out["mfu_percent"] == pytest.approx(100 * out["mfu"])
    assert out["peak_source"] == "datasheet H100 bf16 dense" and out["throughput_na"] == ""
    assert out["ranks"][0]["tokens_per_s"] == out["tokens_per_s"]
    assert any("model throughput 50 tokens/s" in line for line in summary_lines(state))


def test_zeroscope_summary_says_the_runs_model_throughput(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """``zeroscope summary`` of a trace prints the run's tokens/s, model FLOP/s and MFU (it
    printed them under --json only), as the live run's final summary says them: the text
    goes through the JSON report's fields, the live line through the run's figures."""
    from pathlib import Path

    from tests.fixtures import RunShape, synthetic_run, write_trace
    from zeroscope.cli import main

    run = synthetic_run(RunShape(ranks=4, steps=6, work=True))
    path = Path(str(tmp_path)) / "run.zstrace"
    write_trace(path, run)
    assert main(["summary", str(path)]) == 0
    printed = [x for x in capsys.readouterr().out.splitlines() if x.startswith("model throughput")]
    state = ClusterState()
    state.ingest_all(run)
    state.flush()
    live = [x for x in summary_lines(state) if x.startswith("model throughput")]
    assert printed == live and len(live) == 1
    # The figure itself, from the reports: every rank's tokens of the steady steps over the
    # cluster's step times (the slowest rank's).
    steady = [
        m
        for m in run
        if isinstance(m, StepReport)
        and m.step > min(r.step for r in run if isinstance(r, StepReport))
    ]
    tokens = sum(m.work.tokens for m in steady if m.work is not None)
    seconds = sum(
        max(m.duration_s for m in steady if m.step == s) for s in {m.step for m in steady}
    )
    assert f"model throughput {units.count(tokens / seconds)} tokens/s" in live[0]


def test_a_run_divides_steps_reported_before_the_probe_ended_by_the_peak_found_later() -> None:
    # On a loaded machine the peak probe (a thread) ends after step 2 has gone out: that
    # step's own figure is NA while the peak is being measured, but the run's MFU divides
    # every step by the one peak of the process, and the run's NA reason is not that one.
    state = _state(2)
    measuring = _work(peak_flops=None, peak_source="peak being measured")
    for step, works in (
        (1, (measuring, measuring)),
        (2, (measuring, _work())),
        (3, (_work(),) * 2),
    ):
        for rank, w in enumerate(works):
            aggs = state.ingest(_report(rank, step, 2.0, w))
        if step == 2:
            assert cluster_step(aggs[0]).mfu is None
    out = run_report(state)
    assert out["mfu"] == pytest.approx(4 * 4e12 / (4.0 * 2 * 1e14))
    assert out["throughput_na"] == "" and out["peak_source"] == "datasheet H100 bf16 dense"
    assert [r["mfu"] for r in out["ranks"]] == pytest.approx([4e12 * 2 / (4.0 * 1e14)] * 2)


def test_a_runs_figures_rest_on_the_steps_that_measured_them_and_say_so() -> None:
    # Variable-length batches: step 3's shape was past the agent's counts (FLOPs NA, tokens
    # known), step 5's rank said no tokens either. The run's TFLOP/s and MFU are the counted
    # steps' (2 and 4: 8e12 FLOPs in 4 s), tokens/s every step's that had tokens (2, 3, 4),
    # each with how many steps it rests on and why the rest are out; none is NA.
    state = _state(1)
    uncounted = _work(flops=None, na="FLOPs not counted: a sixth input shape")
    silent = _work(tokens=None, flops=None, positions=None, na="not a batch of sequences")
    for step, seconds, work in (
        (1, 9.0, _work()),
        (2, 1.0, _work()),
        (3, 5.0, uncounted),
        (4, 3.0, _work()),
        (5, 7.0, silent),
    ):
        state.ingest(_report(0, step, seconds, work))
    out = run_report(state)
    assert out["tflops_per_s"] == pytest.approx(8e12 / 4.0 / 1e12)
    assert out["mfu"] == pytest.approx(8e12 / (4.0 * 1e14))
    assert out["tokens_per_s"] == pytest.approx(300 / 9.0)
    assert out["throughput_na"] == ""
    over = out["throughput_over"]
    assert "tokens/s over 3 of 4 steps (the rest: not a batch of sequences)" in over
    assert "TFLOP/s and MFU over 2 of 4 steps (the rest: FLOPs not counted: a sixth" in over
    line = next(x for x in summary_lines(state) if x.startswith("model throughput"))
    assert "MFU 2.0%" in line and "TFLOP/s and MFU over 2 of 4 steps" in line
    # Every step measured: nothing said; no step measured: NA with the reason, as before.
    whole = _state(1)
    for step in (1, 2, 3):
        whole.ingest(_report(0, step, 1.0, _work()))
    assert run_report(whole)["throughput_over"] == ""
    none = _state(1)
    for step in (1, 2, 3):
        none.ingest(_report(0, step, 1.0, uncounted))
    out = run_report(none)
    assert out["mfu"] is None and out["tflops_per_s"] is None and out["throughput_over"] == ""
    assert "sixth input shape" in out["throughput_na"]


@pytest.mark.parametrize(
    ("works", "reason"),
    [
        ([None, _work()], "reported no tokens or FLOPs"),
        ([_work(tokens=None, positions=None, na="not a batch of sequences"), _work()], "sequences"),
        ([_work(peak_flops=None, peak_source="peak being measured"), _work()], "peak being"),
    ],
)
def test_a_partial_cluster_sum_is_na_with_the_reason(works: list, reason: str) -> None:
    state = _state(2)
    state.ingest(_report(0, 1, 1.0, works[0]))
    (agg,) = state.ingest(_report(1, 1, 1.0, works[1]))
    c = cluster_step(agg)
    assert reason in c.na
    if works[0] is None or works[0].tokens is None:
        assert c.tokens_per_s is None
    if works[0] is None or works[0].peak_flops is None:
        assert c.mfu is None
    assert "NA" in step_line(agg)


def _step(
    meter: WorkMeter, model: torch.nn.Module, step: int, *inputs: object, **kw: object
) -> Work:
    meter.inputs(model, inputs, kw, step)
    loss = model(*inputs, **kw)
    loss.backward()
    facts = meter.take(step)
    assert facts is not None
    return work_report(facts)


def test_meter_counts_once_per_shape_and_again_when_shapes_change() -> None:
    torch.manual_seed(0)
    model, meter = KnownGPT(seq=16), WorkMeter()
    idx = torch.randint(0, 64, (2, 16))
    first = _step(meter, model, 1, idx, idx)
    again = _step(meter, model, 2, idx, idx)  # the shape is back: counted again, once
    assert first.flops == again.flops == sum(closed_form(32, seq=16)) and again.flops_step == 2
    reused = _step(meter, model, 3, idx, idx)
    assert reused.flops == first.flops and reused.flops_step == 2
    short = torch.randint(0, 64, (2, 8))
    recounted = _step(meter, model, 4, short, short)
    assert recounted.flops_step == 4 and recounted.flops == sum(closed_form(16, seq=8))
    assert recounted.tokens == 16


def test_an_evaluation_forward_between_steps_is_not_the_steps_work() -> None:
    """A forward under ``no_grad`` / ``inference_mode`` through the same model (DeepSpeed's
    ``engine.eval()`` passes, a validation loop through the DDP module) trains nothing: the
    step's tokens are its training micro-batches' only (before: 1280 tokens a step shown for
    512 trained, tokens/s 2.4x too high)."""
    torch.manual_seed(0)
    model, meter = KnownGPT(seq=16), WorkMeter()
    idx = torch.randint(0, 64, (2, 16))
    plain = _step(meter, model, 1, idx, idx)
    for mode in (torch.no_grad, torch.inference_mode):
        with mode():
            meter.inputs(model, (idx, idx), {}, 2)
            model(idx, idx)
    evaluated = _step(meter, model, 2, idx, idx)
    assert plain.tokens == evaluated.tokens == 32
    assert evaluated.flops == plain.flops


def test_two_models_trained_in_turn_keep_their_counts() -> None:
    """Two models in turn, by step (two tasks) or within a step (a GAN's G then D): each model's
    counts are kept for when it is back, so steps reuse them; before, each change of model
    cleared them and every step ran under the counter (a DDP GAN 2.5x slower)."""
    torch.manual_seed(0)
    a, b, meter = KnownGPT(seq=16), KnownGPT(seq=8), WorkMeter()
    ids = {a: torch.randint(0, 64, (2, 16)), b: torch.randint(0, 64, (2, 8))}
    by_step = [_step(meter, m, step, ids[m], ids[m]) for step, m in enumerate([a, b] * 4, 1)]
    # Counted once, checked once (its shape back), then reused: a's at steps 1 and 3, b's 2, 4.
    assert [w.flops_step for w in by_step] == [1, 2, 3, 4, 3, 4, 3, 4]
    assert [w.flops for w in by_step[4:]] == [by_step[2].flops, by_step[3].flops] * 2
    assert [w.tokens for w in by_step] == [32, 16] * 4

    meter = WorkMeter()
    within = []
    for step in range(1, 6):  # G's forward opens the step; D's forward runs inside it
        meter.inputs(a, (ids[a], ids[a]), {}, step)
        meter.inputs(b, (ids[b], ids[b]), {}, step)
        (a(ids[a], ids[a]) + b(ids[b], ids[b])).backward()
        facts = meter.take(step)
        assert facts is not None
        within.append(work_report(facts))
    assert [w.flops_step for w in within] == [1, 2, 2, 2, 2]
    assert [w.tokens for w in within] == [32] * 5  # the step's model's own micro-batches


class _MaskedHead(torch.nn.Module):
    """Work that follows the data, not the shapes: the head runs over the even ids only (a
    masked-LM head over the masked positions)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.head = torch.nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return self.head(h[ids % 2 == 0]).pow(2).mean() + h.mean()


def test_a_model_whose_work_follows_its_data_reuses_no_count() -> None:
    torch.manual_seed(0)
    model, meter = _MaskedHead(), WorkMeter()

    def ids(even: int) -> torch.Tensor:  # 2 x 8 positions, ``even`` of them even ids
        flat = torch.tensor([2] * even + [1] * (16 - even))
        return flat.reshape(2, 8)

    def head(n: int) -> float:  # the head's matmuls: forward, input and weight gradients
        return 3 * 2.0 * n * 16 * 32

    first = _step(meter, model, 1, ids(12))
    second = _step(meter, model, 2, ids(4))  # same shape: the check counts it, and differs
    assert (first.flops, second.flops) == (head(12), head(4)), (first, second)
    assert second.flops_step == 2
    third = _step(meter, model, 3, ids(12))
    assert third.flops is None and third.tokens == 16
    assert "changes with its data" in third.na and "step 1" in third.na and "step 2" in third.na


def test_the_data_check_is_not_spent_on_a_step_whose_later_micro_batch_is_new() -> None:
    """Gradient accumulation with dynamic padding: step 2's first micro-batch has step 1's
    shape (so a check is due) but its second is new, so its shapes were never counted and
    nothing was checked. Before, that spent the one check, and step 3, step 1's shapes again
    with other data, reused step 1's count: a figure the model did not do."""
    torch.manual_seed(0)
    model, meter = _MaskedHead(), WorkMeter()

    def ids(even: int, length: int = 8) -> torch.Tensor:
        flat = torch.tensor([2] * even + [1] * (2 * length - even))
        return flat.reshape(2, length)

    def step(n: int, *batches: torch.Tensor) -> Work:
        for batch in batches:
            meter.inputs(model, (batch,), {}, n)
            model(batch).backward()
            meter.pause()
        facts = meter.take(n)
        assert facts is not None
        return work_report(facts)

    first = step(1, ids(12), ids(6, 5))
    second = step(2, ids(12), ids(6, 3))  # new shapes after all: counted, nothing checked
    third = step(3, ids(4), ids(6, 5))  # step 1's shapes, other data: the check, and differs
    assert second.flops_step == 2 and third.flops_step == 3
    assert third.flops != first.flops
    fourth = step(4, ids(12), ids(6, 5))
    assert fourth.flops is None and "changes with its data" in fourth.na, fourth


def test_meter_counts_up_to_its_budget_then_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work_mod, "MAX_COUNTS", 1)
    model, meter = KnownGPT(seq=16), WorkMeter()
    _step(
        meter, model, 1, torch.zeros(1, 16, dtype=torch.long), torch.zeros(1, 16, dtype=torch.long)
    )
    other = torch.zeros(1, 4, dtype=torch.long)
    w = _step(meter, model, 2, other, other)
    assert w.flops is None and "1 counts spent" in w.na and w.tokens == 4


def test_meter_off_and_non_sequence_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(work_mod.FLOPS_ENV, "0")
    model, meter = KnownGPT(seq=16), WorkMeter()
    idx = torch.zeros(2, 16, dtype=torch.long)
    w = _step(meter, model, 1, idx, idx)
    assert w.flops is None and "ZEROSCOPE_FLOPS=0" in w.na and w.tokens == 32
    monkeypatch.delenv(work_mod.FLOPS_ENV)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(1))
    conv(torch.zeros(1, 3, 8, 8))

    def image_loss(x: torch.Tensor) -> torch.Tensor:
        return conv(x).sum()

    image_meter = WorkMeter()
    image_meter.inputs(conv, (torch.zeros(2, 3, 8, 8),), {}, 1)
    image_loss(torch.zeros(2, 3, 8, 8)).backward()
    facts = image_meter.take(1)
    assert facts is not None
    w = work_report(facts)
    assert w.tokens is None and "[2, 3, 8, 8] is not a batch of sequences" in w.na
    assert w.flops is not None and w.flops > 0


def test_meter_reads_a_dict_batch_and_leaves_padding_out() -> None:
    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt = KnownGPT(seq=16)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.gpt(input_ids, input_ids)

    model, meter = Wrapped(), WorkMeter()
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    w = _step(meter, model, 1, input_ids=torch.zeros(2, 16, dtype=torch.long), attention_mask=mask)
    assert (w.tokens, w.positions, w.seq_len) == (26, 32, 16)


def test_datasheet_table_names_gpus_as_torch_does() -> None:
    assert datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == (
        989.4e12,
        "datasheet H100 bf16 dense",
    )
    assert datasheet_peak("NVIDIA H100 PCIe", "bf16")[0] == 756e12  # type: ignore[index]
    assert datasheet_peak("NVIDIA H200", "fp16")[0] == 989.4e12  # type: ignore[index]
    assert datasheet_peak("NVIDIA A100-SXM4-80GB", "fp32")[0] == 19.5e12  # type: ignore[index]
    assert datasheet_peak("Tesla V100-SXM2-32GB", "bf16") is None  # V100 has no bf16
    assert datasheet_peak("Some Future GPU", "bf16") is None


def test_peak_probe_measures_on_cpu_or_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = measure_matmul(torch, torch.device("cpu"), torch.float32, 128, seconds=0.05)
    assert measured is not None and measured > 0
    monkeypatch.setenv(peak_mod.PEAK_PROBE_ENV, "0")
    probe = PeakProbe()
    probe.start(torch, torch.device("cpu"), "fp32")
    assert probe.figure() == (
        None,
        f"no datasheet peak for this device, and {peak_mod.PEAK_PROBE_ENV}=0",
    )


_PROBE_THEN_EXIT = """
import threading, torch
from zeroscope.agent.peak import PeakProbe
PeakProbe.PROBE_S = 600.0
probe = PeakProbe()
probe.start(torch, torch.device("cpu"), "bf16")
print(probe.figure()[1], flush=True)
"""


def test_a_job_that_ends_while_the_peak_is_measured_is_not_held_by_it() -> None:
    """The probe's thread is not a daemon (a job finalized under a matmul aborts), so the
    interpreter waits for it: a job that ends first stops it after the matmul under way, where
    it held the exit for its whole measurement (~0.25 s a dtype; here 600 s, so a probe the end
    does not stop fails the timeout), and the peak is NA with the reason, not a partial best."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE_THEN_EXIT],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, peak_mod.PEAK_PROBE_ENV: "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "peak being measured"
    probe = PeakProbe()
    probe.PROBE_S = 600.0
    probe.start(torch, torch.device("cpu"), "fp32")
    thread = probe.thread  # (not found by name: another test's probe may still be measuring)
    assert thread is not None
    probe.stop()
    thread.join(300)
    assert not thread.is_alive()
    assert probe.figure() == (None, "the job ended before the peak was measured")


def test_a_new_model_is_counted_anew_even_where_it_reuses_a_freed_ones_id() -> None:
    meter = WorkMeter()
    idx = torch.zeros(2, 16, dtype=torch.long)
    first = _step(meter, KnownGPT(seq=16, layers=1), 1, idx, idx)  # freed after this step
    second = _step(meter, KnownGPT(seq=16, layers=2), 2, idx, idx)
    assert first.flops == sum(closed_form(32, layers=1, seq=16))
    assert second.flops == sum(closed_form(32, layers=2, seq=16)) and second.flops_step == 2


def test_a_model_with_compiled_modules_is_not_counted_and_says_why() -> None:
    """A dispatch mode around a compiled call changes what Dynamo compiles (a per-block
    ``module.compile()`` under FSDP2 compiled no frame under the count): such a model's FLOPs
    are NA with the reason, its tokens still counted, and nothing is compiled differently."""
    torch.manual_seed(0)
    model, meter = KnownGPT(seq=16), WorkMeter()
    block = next(m for m in model.modules() if m is not model and list(m.parameters()))
    block.compile(backend="eager")
    idx = torch.randint(0, 64, (2, 16))
    w = _step(meter, model, 1, idx, idx)
    assert w.flops is None and w.na == work_mod.COMPILED_NA and w.tokens == 32
    assert meter._counter is None  # no count was ever entered


def test_a_peak_the_model_exceeds_gives_mfu_na_with_both_figures() -> None:
    """A measured peak below what the model reached (the probe slowed by other load, or run in
    a slower dtype) is no ceiling: MFU is NA with the reason, never a figure over 100 %."""
    state = _state(1)
    (agg,) = state.ingest(_report(0, 1, 1.0, _work(flops=3e12, peak_flops=1e12)))
    r0 = rank_step(agg.summaries[0])
    assert r0.tflops_per_s == 3.0 and r0.mfu is None
    assert "above the peak 1 TFLOP/s" in r0.na and "reached 3 TFLOP/s" in r0.na


class _UnlistedGpuTorch:
    """torch as the probe sees it on a GPU the datasheet table does not know; any attempt to
    run the probe there (tensors, streams) would fail loudly."""

    bfloat16, float16, float32 = torch.bfloat16, torch.float16, torch.float32

    class cuda:
        @staticmethod
        def get_device_name(device: object) -> str:
            return "Some Future GPU"

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the probe touched torch.{name} on the GPU")


def test_an_unlisted_gpu_is_never_probed_and_a_given_peak_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU probe's matrices would stay in the job's caching allocator: an unlisted GPU gets
    MFU NA with the reason and how to give the peak, and ZEROSCOPE_PEAK_TFLOPS gives it."""
    monkeypatch.delenv(peak_mod.PEAK_TFLOPS_ENV, raising=False)

    def no_probe_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("a probe thread was started for the GPU")

    monkeypatch.setattr(peak_mod.threading, "Thread", no_probe_thread)
    probe = PeakProbe()
    probe.start(_UnlistedGpuTorch(), torch.device("cuda", 0), "bf16")
    peak, why = probe.figure()
    assert peak is None and "Some Future GPU (bf16) is not in" in why
    assert peak_mod.PEAK_TFLOPS_ENV in why
    monkeypatch.setenv(peak_mod.PEAK_TFLOPS_ENV, "312.5")
    given = PeakProbe()
    given.start(_UnlistedGpuTorch(), torch.device("cuda", 0), "bf16")
    assert given.figure() == (312.5e12, f"{peak_mod.PEAK_TFLOPS_ENV}=312.5")
    monkeypatch.setenv(peak_mod.PEAK_TFLOPS_ENV, "fast")
    bad = PeakProbe()
    bad.start(torch, torch.device("cpu"), "fp32")
    assert bad.figure()[0] is None and "not a number" in bad.figure()[1]


@pytest.mark.parametrize(
    ("fp16_rate", "fp32_rate", "chosen", "said"),
    [
        (0.84e9, 48e9, 48e9, "measured fp32 256x256 matmul on cpu, faster here than fp16's"),
        (90e9, 48e9, 90e9, "measured fp16 256x256 matmul on cpu"),
    ],
)
def test_a_16_bit_jobs_cpu_peak_is_the_best_of_its_dtype_and_fp32(
    monkeypatch: pytest.MonkeyPatch, fp16_rate: float, fp32_rate: float, chosen: float, said: str
) -> None:
    """This CPU runs fp16 matmuls at ~2 % of fp32's speed: the fp16 figure alone was below
    what the fp16 demo reached, so its MFU went NA above 100 % after its first step. The
    measured rates are injected: two timings of the same matmul on a busy 2-core machine
    differ by more than the factor a comparison of real ones would need (CI once read the
    probe's fp32 at 3.0 GFLOP/s and the test's own at over 3.5)."""
    rates = {torch.float16: fp16_rate, torch.float32: fp32_rate}
    asked: list[tuple[object, int]] = []

    def measured(torch_: object, device: object, dtype: object, size: int, *_: object) -> float:
        asked.append((dtype, size))
        return rates[dtype]  # type: ignore[index]

    monkeypatch.setattr(peak_mod, "measure_matmul", measured)
    probe = PeakProbe()
    probe._measure(torch, torch.device("cpu"), torch.float16, 256, "fp16")
    assert probe.figure() == (chosen, said)
    assert asked == [(torch.float16, 256), (torch.float32, 256)]


def test_a_real_cpu_probe_names_the_dtype_it_measured() -> None:
    """The probe over real matmuls: a positive peak, from one of the two dtypes it timed."""
    probe = PeakProbe()
    probe._measure(torch, torch.device("cpu"), torch.float16, 128, "fp16")
    peak, source = probe.figure()
    assert peak is not None and peak > 0
    assert source in (
        "measured fp16 128x128 matmul on cpu",
        "measured fp32 128x128 matmul on cpu, faster here than fp16's",
    )


def test_the_peak_a_run_shows_is_the_one_its_mfu_divides_by() -> None:
    """A run's MFU divides by the counted steps' time-weighted peak; the summary printed the
    last step's beside it. A last step with one rank's report lost read half the peak: "MFU
    9.1% of 175GFLOP/s" next to 28.1 GFLOP/s (a new user's salvaged trace). Now MFU = the
    TFLOP/s shown / the peak shown."""
    state = _state(2)
    for step, ranks in ((1, (0, 1)), (2, (0, 1)), (3, (0, 1)), (4, (0,))):
        for rank in ranks:
            state.ingest(_report(rank, step, 2.0, _work()))
    state.flush()
    out = run_report(state)
    assert out["mfu"] == pytest.approx(out["tflops_per_s"] / out["peak_tflops"])
    # steps 2-3 with both ranks' peaks (2e14), step 4 with one (1e14), each 2 s
    assert out["peak_tflops"] == pytest.approx((2e14 * 4 + 1e14 * 2) / 6 / 1e12)


def test_a_steps_figures_over_many_ranks_equal_their_definitions() -> None:
    """``of_step`` over many ranks' works (the close of a 16,384-rank step asks it of every
    rank's) against the definitions written out: each sum over the ranks in order, NA when a
    rank lacks the figure, and the reason every rank's NA joined (each reason once, in order)."""
    import random

    from zeroscope.state.throughput import _joined, _reason, of_step

    rng = random.Random(5)
    for i in range(400):
        works: list[Work | None] = []
        # Half the steps' ranks share one model (the predicted FLOPs' terms alike, as in a real
        # job), half differ, some with a term unknown; every third step has every figure known.
        mixed, known_only = i % 2 == 1, i % 3 == 0
        for _ in range(rng.randint(1, 40)):
            roll = rng.uniform(0.2, 1.0) if known_only else rng.random()
            if roll < 0.05:
                works.append(None)
                continue
            works.append(
                _work(
                    tokens=None if roll < 0.1 else rng.randint(1, 10**6),
                    flops=None if 0.1 <= roll < 0.15 else rng.uniform(1e9, 1e12),
                    peak_flops=None if 0.15 <= roll < 0.2 else rng.uniform(1e14, 1e15),
                    peak_source=rng.choice(["datasheet H100", "measured matmul"]),
                    na=rng.choice(["", "inputs are not sequences", "shape not counted"]),
                    **(
                        {
                            "dense_params": rng.choice([1000, 3000, None]),
                            "positions": rng.choice([128, 96]),
                            "layers": rng.choice([2, 0]),
                        }
                        if mixed
                        else {}
                    ),
                )
            )
        seconds = rng.uniform(0.5, 2.0)
        got = of_step(works, seconds)
        known = [w for w in works if w is not None]
        whole = len(known) == len(works)

        def total(values: list, whole: bool = whole) -> float | None:
            return sum(v for v in values if v is not None) if whole and None not in values else None

        tokens = total([w.tokens for w in known])
        flops = total([w.flops for w in known])
        assert got.tokens_per_step == tokens
        assert got.flops_per_step == flops
        assert got.tokens_per_s == (None if tokens is None else tokens / seconds)
        predicted = total([predicted_flops(w) for w in known])
        assert got.predicted_flops_per_step == predicted
        reasons = _joined(*(_reason(w) for w in works))
        if got.mfu is not None or "MFU NA" not in got.na:
            assert got.na == reasons
        peaks = total([w.peak_flops for w in known])
        assert got.peak_tflops == (None if peaks is None else peaks / 1e12)
        if flops is not None and peaks is not None and flops / seconds <= peaks:
            assert got.mfu == flops / seconds / peaks
        else:
            assert got.mfu is None
        sources = {w.peak_source for w in known if w.peak_flops is not None}
        assert got.peak_source == "; ".join(sorted(sources))
