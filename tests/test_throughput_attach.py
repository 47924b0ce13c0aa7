"""Tokens, model FLOPs and MFU of unmodified jobs under ``zeroscope run`` (the attach): one
launch of tests/jobs/throughput_train.py trains an HF Llama built from a config under DDP
(token ids with right padding through an attention mask), the known-shape GPT under FSDP2,
an MLP on feature vectors under DDP and the GPT again under DeepSpeed ZeRO-3, each with 2
micro-batches per optimizer step; the same script also runs under bare torchrun.

Oracles: the run without zeroscope (losses, bit for bit: the FLOP count ran on each model's
first step); the mask sums the script counted itself (tokens leave padding out); micro x seq x
accumulation (positions); the closed form with N a formula of each model's config; NA with the
reason for the MLP's tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.attach_support import job_env, read_outputs, read_trace, run_plain, run_zeroscope
from tests.jobs.throughput_train import ACCUMULATION, LLAMA, MICRO, SEQ, llama_dense_params
from tests.throughput_support import closed_form
from zeroscope.commands.summary import summarize

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).parent / "jobs" / "throughput_train.py"
MODES = ["ddp-llama", "fsdp2-gpt", "mlp-ddp", "ds-zero3-gpt"]
STEPS = 3
N = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("throughput-attach")
    env = job_env()  # the FLOP count is on by default
    args = ["--modes", ",".join(MODES), "--steps", str(STEPS)]
    run_plain(SCRIPT, [*args, "--out", str(tmp / "plain")], env, timeout=600)
    run_zeroscope(SCRIPT, [*args, "--out", str(tmp / "zs")], env, tmp / "t.zstrace", 600)
    return {
        "plain": read_outputs(tmp / "plain"),
        "zs": read_outputs(tmp / "zs"),
        "trace": read_trace(tmp / "t.zstrace"),
        "path": tmp / "t.zstrace",
    }


def test_losses_are_bit_identical_with_the_flop_count(runs: dict) -> None:
    for plain, zs in zip(runs["plain"], runs["zs"], strict=True):
        for mode in MODES:
            assert zs[mode]["losses"] == plain[mode]["losses"], mode


def steps_of(runs: dict, rank: int, mode: str) -> list:
    steps = runs["trace"][rank].steps
    assert [s.step for s in steps] == list(range(1, STEPS * len(MODES) + 1))
    i = MODES.index(mode)
    return steps[i * STEPS : (i + 1) * STEPS]


def test_llama_under_ddp_tokens_and_flops(runs: dict) -> None:
    positions = MICRO * SEQ * ACCUMULATION
    dense = 6.0 * llama_dense_params() * positions
    h, layers = LLAMA["hidden_size"], LLAMA["num_hidden_layers"]
    attention = 12.0 * layers * h * SEQ * positions
    for rank in range(N):
        said = runs["zs"][rank]["ddp-llama"]["tokens"]
        for report, tokens in zip(steps_of(runs, rank, "ddp-llama"), said, strict=True):
            w = report.work
            assert w is not None and w.na == ""
            assert w.positions == positions and w.tokens == tokens < positions
            assert w.dense_params == llama_dense_params()
            assert (w.layers, w.hidden, w.seq_len) == (layers, h, SEQ)
            # torch's attention formula counts the backward's recomputed scores (five batched
            # matmuls backward, not four): the attention term comes out 7/6 of the textbook
            # one, and the dense part matches 6·N·T to the FLOP.
            assert w.flops == dense + attention * 7 / 6
            assert w.flops_step == min(report.step, 2)  # counted, checked (agent/work.py)


def test_gpt_under_fsdp2_flops_match_the_closed_form(runs: dict) -> None:
    positions = MICRO * SEQ * ACCUMULATION
    dense, attention = closed_form(positions, seq=SEQ)
    for rank in range(N):
        for report in steps_of(runs, rank, "fsdp2-gpt"):
            w = report.work
            assert w is not None and w.tokens == w.positions == positions
            assert w.flops == dense + attention
            assert w.flops_step == min(report.step, STEPS + 2)  # counted, checked


def test_gpt_under_deepspeed_zero3_flops_match_the_closed_form(runs: dict) -> None:
    # ZeRO-3's hooks gather each parameter for its use: the count sees the whole matmuls, and
    # N is read through the partitioned parameters' ds_numel / ds_shape.
    positions = MICRO * SEQ * ACCUMULATION
    dense, attention = closed_form(positions, seq=SEQ)
    first = 3 * STEPS + 1
    for rank in range(N):
        for report in steps_of(runs, rank, "ds-zero3-gpt"):
            w = report.work
            assert w is not None and w.tokens == w.positions == positions
            assert w.flops == dense + attention
            assert w.flops_step == min(report.step, first + 1)  # counted, checked


def test_mlp_tokens_are_na_with_the_reason(runs: dict) -> None:
    for rank in range(N):
        for report in steps_of(runs, rank, "mlp-ddp"):
            w = report.work
            assert w is not None and w.tokens is None and w.positions is None
            assert "[2, 24] is not a batch of sequences" in w.na
            # Its FLOPs are still counted: 6 x weights x samples for the two linear layers,
            # less the first one's input gradient (2 x its weights x samples), which autograd
            # never computes: the input is data, not a parameter's output.
            samples = MICRO * ACCUMULATION
            assert w.flops == 6.0 * (24 * 32 + 32 * 4) * samples - 2.0 * 24 * 32 * samples


def test_summary_has_the_cluster_figures(runs: dict) -> None:
    out = summarize(runs["path"])
    # The MLP's steps say no tokens (not a batch of sequences): the run's tokens/s rests on the
    # other models' steady steps, and says so; TFLOP/s and MFU on every step.
    steady = [i for i in range(1, STEPS * len(MODES)) if i // STEPS != MODES.index("mlp-ddp")]
    tokens = sum(runs["trace"][r].steps[i].work.tokens for r in range(N) for i in steady)
    seconds = sum(max(runs["trace"][r].steps[i].duration_s for r in range(N)) for i in steady)
    assert out["tokens_per_s"] == pytest.approx(tokens / seconds)
    over = f"tokens/s over {len(steady)} of {STEPS * len(MODES) - 1} steps (the rest: "
    assert over in out["throughput_over"] and "not a batch of sequences" in out["throughput_over"]
    assert out["tflops_per_s"] is not None and out["mfu"] is not None
    assert out["peak_source"].startswith("measured")
