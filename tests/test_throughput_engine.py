"""Tokens/s, TFLOP/s and MFU end to end on the bundled engine: a GPT of known shape
(tests/throughput_support.py) on two gloo ranks with the live agent recording to a real
Collector, micro-batch 2, 2 accumulation steps, sequence 16.

Oracles: tokens per step = micro x seq x accumulation (per rank; x world for the cluster);
counted FLOPs = the closed form 6·N·T + 12·layers·hidden·seq·T with N a formula of the
model's dimensions (not the agent's own parameter walk); MFU recomputed from the trace's raw
figures against the measured CPU peak; the losses of the same run without zeroscope, bit for
bit (the FLOP count ran on step 1)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.distributed import run_ranks
from tests.throughput_support import KnownGPT, closed_form, dense_params
from zeroscope.agent.schema import Bye, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.commands.summary import summarize
from zeroscope.store.trace import TraceReader

STEPS, MICRO, ACCUMULATION, SEQ, WORLD = 4, 2, 2, 16, 2
CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": ACCUMULATION,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def train(rank: int, world: int, address: str | None) -> list[float]:
    import torch

    from zeroscope.agent import api
    from zeroscope.engine.api import initialize

    if address:
        os.environ[api.COLLECTOR_ENV] = address
        os.environ["ZEROSCOPE_JOB_ID"] = "throughput"
    else:
        os.environ.pop(api.COLLECTOR_ENV, None)
    api.set_telemetry(None)
    torch.manual_seed(0)
    engine, _, _, _ = initialize(model=KnownGPT(seq=SEQ), config=dict(CONFIG))
    g = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(STEPS * ACCUMULATION):
        data = torch.randint(0, 64, (MICRO, SEQ + 1), generator=g)
        loss = engine(data[:, :-1], data[:, 1:])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    if address:
        api.telemetry().close()
    return losses


def test_engine_reports_tokens_flops_and_mfu(tmp_path: Path) -> None:
    path = tmp_path / "throughput.zst"
    byes: list[Bye] = []
    col = Collector(record=path)
    col.add_listener(lambda m: byes.append(m) if isinstance(m, Bye) else None)
    with col:
        watched = run_ranks(train, WORLD, col.ingest_address)
        assert wait_for(lambda: len(byes) == WORLD)
    plain = run_ranks(train, WORLD, None)
    # The FLOP count (FlopCounterMode over step 1) changed nothing the job computed.
    assert watched == plain

    tokens = MICRO * SEQ * ACCUMULATION
    dense, attention = closed_form(tokens, seq=SEQ)
    reports: dict[int, list[StepReport]] = {}
    with TraceReader(path) as trace:
        for rank in range(WORLD):
            reps = [m for m in trace.messages(ranks=[rank], kinds=["step"])]
            reports[rank] = [r for r in reps if isinstance(r, StepReport)]
    for reps in reports.values():
        assert [r.step for r in reps] == list(range(1, STEPS + 1))
        for r in reps:
            w = r.work
            assert w is not None and w.na == ""
            assert w.tokens == w.positions == tokens
            # Counted at step 1 and again at step 2, its shapes' first return (agent/work.py's
            # check that the work follows the shapes); the later steps reuse that count.
            assert w.seq_len == SEQ and w.flops_step == min(r.step, 2)
            assert w.dense_params == dense_params()
            # Counted = closed form: the dense term and the attention term, to the FLOP.
            assert w.flops == dense + attention and attention > 0
        assert reps[-1].work is not None and reps[-1].work.peak_flops is not None
        assert reps[-1].work.peak_source.startswith("measured fp32")

    out = summarize(path)
    steady = [
        [reports[r][i] for r in range(WORLD)] for i in range(1, STEPS)
    ]  # every step but the first
    assert out["tokens_per_step"] == tokens * WORLD
    seconds = sum(max(r.duration_s for r in step) for step in steady)
    flops = sum(r.work.flops for step in steady for r in step if r.work and r.work.flops)
    # Each rank's peak is one figure per process (its last report's): a step reported before
    # the probe's thread ended is divided by it too.
    peaks = {rank: reps[-1].work.peak_flops for rank, reps in reports.items()}
    peak_time = sum(
        max(r.duration_s for r in step) * sum(peaks[r.rank] for r in step) for step in steady
    )
    assert (
        abs(out["tokens_per_s"] - tokens * WORLD * len(steady) / seconds)
        < 1e-6 * out["tokens_per_s"]
    )
    assert abs(out["tflops_per_s"] - flops / seconds / 1e12) < 1e-9 + 1e-6 * out["tflops_per_s"]
    assert abs(out["mfu"] - flops / peak_time) < 1e-9 and 0 < out["mfu"] < 1
    assert out["mfu_percent"] == 100 * out["mfu"]
    assert out["predicted_flops_per_step"] == out["flops_per_step"] == WORLD * (dense + attention)
    assert out["peak_source"].startswith("measured fp32") and out["throughput_na"] == ""
    for row in out["ranks"]:
        assert row["tokens_per_step"] == tokens and row["mfu"] is not None
