"""Tier 3: derived figures of real 2- and 3-rank runs of the bundled engine, with the live agent
reporting to real recording collectors, against known answers:

- one rank sleeping 100 ms more per step is named as the straggler, and only it (2 and 3
  ranks; a small MLP, so that the step is short and the shared CPU's own stragglers — a
  descheduled rank is a real straggler — stay small beside the injected one);
- samples/s is steps/s times the known global batch;
- the communication volume per steady step matches the engine's traffic model for the config
  (stage 2 and stage 3 under gradient accumulation, stage 3 with and without persistence);
- every collective lies on its step's axis (gradient accumulation: each reduce-scatter inside
  a backward phase), and every step has its optimizer phase;
- the live state (fed in arrival order, as ``zeroscope run`` feeds it), ``replay --headless``,
  ``summary --json`` and ``export`` give identical figures.

One process-group launch per world size runs every config of that size in turn.
"""

from __future__ import annotations

import io
import os
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches
from zeroscope.agent.schema import Bye, Message, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.commands.export import chrome_events
from zeroscope.commands.replay import replay_headless
from zeroscope.commands.summary import summarize
from zeroscope.state import ClusterState
from zeroscope.state.lines import step_line, summary_lines
from zeroscope.state.prediction import predicted_traffic
from zeroscope.state.report import run_report
from zeroscope.store.sources import TraceSource
from zeroscope.store.trace import TraceReader

pytestmark = pytest.mark.slow

STEPS = 10
SLEEP_S = 0.1
MICRO = 2


@dataclass
class Job:
    name: str
    zero: dict[str, Any]
    gas: int = 1
    sleep_rank: int | None = None
    model: str = "gpt"
    """"gpt" (tests.models.TinyGPT) or "mlp" (a two-layer MLP: little compute per step)."""
    address: str = ""
    trace: Path = Path()
    live: ClusterState = field(default_factory=ClusterState)
    lines: list[str] = field(default_factory=list)
    byes: int = 0

    def config(self) -> dict[str, Any]:
        return {
            "train_micro_batch_size_per_gpu": MICRO,
            "gradient_accumulation_steps": self.gas,
            "zero_optimization": self.zero,
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        }

    def listen(self, message: Message) -> None:
        """What ``zeroscope run --headless`` does with each message, in arrival order."""
        self.byes += isinstance(message, Bye)
        self.lines += [step_line(a) for a in self.live.ingest(message, time.time())]


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.net(x.to(self.net[0].weight.dtype))
        return nn.functional.mse_loss(out.float(), y)


def _data(model: str, n: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if model == "gpt":
        return batches(n, batch, seed=3)
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(batch, 16, generator=g), torch.randn(batch, 16, generator=g))
            for _ in range(n)]  # fmt: skip


def train(
    rank: int, world: int, jobs: list[tuple[str, str, dict[str, Any], int | None, str]]
) -> None:
    from zeroscope.agent import api
    from zeroscope.engine.api import initialize

    for name, address, config, sleep_rank, model in jobs:
        os.environ[api.COLLECTOR_ENV] = address
        os.environ["ZEROSCOPE_JOB_ID"] = name
        api.set_telemetry(None)
        torch.manual_seed(0)
        engine, _, _, _ = initialize(
            model=TinyGPT() if model == "gpt" else TinyMLP(), config=config
        )
        gas = config["gradient_accumulation_steps"]
        for i, (x, y) in enumerate(_data(model, STEPS * gas, MICRO * world)):
            if rank == sleep_rank and i % gas == 0:
                time.sleep(SLEEP_S)  # 100 ms more per step on this rank, outside any collective
            mine = slice(MICRO * rank, MICRO * rank + MICRO)
            engine.backward(engine(x[mine], y[mine]))
            engine.step()
        api.telemetry().close()


def run_jobs(jobs: list[Job], world: int, tmp_path: Path) -> None:
    collectors = []
    for job in jobs:
        job.trace = tmp_path / f"{job.name}.zstrace"
        col = Collector(record=job.trace)
        col.add_listener(job.listen)
        col.__enter__()
        job.address = col.ingest_address
        collectors.append(col)
    try:
        specs = [(j.name, j.address, j.config(), j.sleep_rank, j.model) for j in jobs]
        run_ranks(train, world, specs, timeout=600)
        for job in jobs:
            assert wait_for(lambda job=job: job.byes == world, 30), job.name  # type: ignore[misc]
    finally:
        for col in collectors:
            col.__exit__(None, None, None)
    for job in jobs:
        job.lines += [step_line(a) for a in job.live.flush()]


def check_identical_figures(job: Job) -> dict[str, Any]:
    """Live state, replay --headless, summary --json and export agree exactly."""
    source = TraceSource(job.trace)
    out = io.StringIO()
    with redirect_stdout(out):
        replay_headless(source)
    source.close()
    replayed = out.getvalue().splitlines()
    live_summary = summary_lines(job.live, str(job.trace))
    assert replayed == job.lines + live_summary
    live = run_report(job.live)
    summary = summarize(job.trace)
    figures: dict[str, Any] = {}
    events = chrome_events(job.trace, figures)
    for key, value in live.items():
        if key == "ranks":
            # summary --json adds each rank's parallel layout (mesh, pipeline); the rest is equal
            extra = [{k: v for k, v in row.items() if k not in live_row} for row, live_row in
                     zip(summary[key], value, strict=True)]  # fmt: skip
            assert all(set(e) == {"mesh", "pipeline"} and e["pipeline"] is None for e in extra)
            assert [{k: row[k] for k in live_row} for row, live_row in
                    zip(summary[key], value, strict=True)] == value  # fmt: skip
        elif key != "job_id":
            assert summary[key] == value, key
        assert figures[key] == value, key
    return {"summary": summary, "events": events}


def check_axes(job: Job, events: list[dict[str, Any]], world: int) -> None:
    with TraceReader(job.trace) as reader:
        reports = list(reader.messages(kinds=["step"]))
    assert all(isinstance(r, StepReport) for r in reports)
    for r in reports:
        assert r.collectives_unfinished == 0
        backward = [(p.start_s, p.start_s + p.duration_s) for p in r.phase_spans
                    if p.name == "backward"]  # fmt: skip
        assert len(backward) == job.gas
        for c in r.collectives:
            if r.step == 1 and c.label.endswith("init"):
                # Inside initialize(), before step 1's start (the loop's first phase).
                assert c.start_s < 0, c
                continue
            assert 0 <= c.start_s <= r.duration_s, (r.step, c)
            if c.op == "reduce_scatter" and c.label == "grads":
                assert any(a <= c.start_s <= b for a, b in backward), (r.step, c, backward)
    optimizer = [e for e in events if e.get("ph") == "X" and e["name"] == "optimizer"]
    assert len(optimizer) == STEPS * world  # every step of every rank, step 1 included


def check_traffic(job: Job, summary: dict[str, Any]) -> float:
    predicted = predicted_traffic(job.live)
    assert predicted is not None
    ratios = [r["comm_bytes_per_step"] / predicted.volume for r in summary["ranks"]]
    assert all(ratio == pytest.approx(1.0, abs=0.02) for ratio in ratios), (job.name, ratios)
    return ratios[0]


def check_straggler(summary: dict[str, Any], rank: int) -> None:
    """The sleeping rank is named, and only it; not as a slow link."""
    (alert,) = summary["alerts"]
    assert (alert["kind"], alert["ranks"]) == ("straggler", [rank]), summary["alerts"]
    assert alert["first_step"] <= 3 and f"r{rank} +" in alert["detail"]
    excess_ms = float(alert["detail"].split(" +")[1].split(" ms")[0])
    assert 50 <= excess_ms <= 400, alert  # 100 ms injected, on a shared, noisy CPU


def test_two_ranks(tmp_path: Path) -> None:
    jobs = [
        Job("s2-gas2-straggler", {"stage": 2}, gas=2, sleep_rank=1, model="mlp"),
        Job("s2-gas2", {"stage": 2}, gas=2),
        Job("s3-default", {"stage": 3}),
        Job("s3-gather-gas2", {"stage": 3, "stage3_param_persistence_threshold": 0}, gas=2),
    ]
    run_jobs(jobs, 2, tmp_path)
    straggler, *healthy = jobs

    got = check_identical_figures(straggler)
    summary = got["summary"]
    check_straggler(summary, 1)
    # Samples are each rank's share (micro x accumulation), added up: the global batch.
    assert summary["samples_per_s"] == pytest.approx(summary["steps_per_s"] * MICRO * 2 * 2)
    check_axes(straggler, got["events"], 2)
    check_traffic(straggler, summary)
    for job in healthy:
        got = check_identical_figures(job)
        check_traffic(job, got["summary"])
        check_axes(job, got["events"], 2)


def test_three_ranks(tmp_path: Path) -> None:
    jobs = [
        Job("s1-straggler", {"stage": 1}, sleep_rank=2, model="mlp"),
        Job("s3-gather", {"stage": 3, "stage3_param_persistence_threshold": 0}),
    ]
    run_jobs(jobs, 3, tmp_path)
    straggler, gathering = jobs
    got = check_identical_figures(straggler)
    summary = got["summary"]
    check_straggler(summary, 2)
    assert summary["samples_per_s"] == pytest.approx(summary["steps_per_s"] * MICRO * 3)
    check_traffic(straggler, summary)
    got = check_identical_figures(gathering)
    check_traffic(gathering, got["summary"])
    check_axes(gathering, got["events"], 3)
