"""Pipeline bubbles measured against the schedule's plan, with stages of known cost.

Every layer is a ``Sleep`` (tests/pipeline_support.py): its forward and its backward each take a
fixed wall time, whatever the load on the machine, so each stage's compute is known in advance.
Two stages, four micro-batches under 1F1B, on 2 gloo ranks; the engine's own reports (layout +
per-step timed actions) go through ClusterState and zeroscope/state/pipeline.py:

- balanced (four equal layers, two per stage): the plan's bubble on each stage is the 1F1B bound
  (p - 1) / (m + p - 1) = 0.2, and the measured bubble (step - compute) agrees with it;
- unbalanced (layers of 3, 3, 1, 1 units, cut uniformly): stage 0 is the slowest (3x the
  compute), stage 1 idles far beyond the plan, and the measured bubbles agree with the
  prediction from the stages' measured durations (the imbalance explains them);
- ``partition_method='profile'`` on the same layers cuts them at [0, 1, 4] (3 vs 5 units).

Tolerances: 0.07 of the step (a step is ~1 s here; P2P over gloo and Python overhead take some
tens of ms under load).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.distributed import run_ranks
from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Hello,
    ParallelLayout,
    PipelineStep,
    StepReport,
)
from zeroscope.state import ClusterState
from zeroscope.state.pipeline import PipelineView, pipeline_view

UNIT = 0.05
CASES = {"balanced": ([1, 1, 1, 1], "uniform"), "unbalanced": ([3, 3, 1, 1], "uniform")}
CASES["profile"] = ([3, 3, 1, 1], "profile")


def _run(rank: int, world: int) -> dict[str, Any]:
    import torch
    from torch import nn

    import zeroscope.engine.api as deepspeed
    from tests.pipeline_support import Sleep
    from tests.recorder import RecordingTelemetry
    from zeroscope.agent.api import set_telemetry
    from zeroscope.engine.parallel.pipe import PipelineModule

    out: dict[str, Any] = {}
    for name, (costs, method) in CASES.items():
        rec = RecordingTelemetry()
        set_telemetry(rec)
        net = PipelineModule(
            [Sleep(UNIT * c) for c in costs],
            num_stages=2,
            loss_fn=nn.MSELoss(),
            partition_method=method,
            profile_input=torch.zeros(2, 8),
        )
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 4,
            "optimizer": {"type": "AdamW"},
            "zero_optimization": {"stage": 1},
        }
        engine, *_ = deepspeed.initialize(model=net, config=config)
        data = iter([(torch.randn(2, 8), torch.randn(2, 8)) for _ in range(12)])
        steps = 1 if name == "profile" else 3
        for _ in range(steps):
            engine.train_batch(data)
        out[name] = {
            "parts": list(net.parts),
            "layout": msgspec.msgpack.encode(rec.layouts[-1]),
            "steps": [msgspec.msgpack.encode(p) for p in rec.pipelines],
        }
    return out


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    return run_ranks(_run, 2, timeout=600)


def views(runs: list[dict[str, Any]], name: str) -> list[PipelineView]:
    """The replica's pipeline view after each step but the first (it carries the stages'
    shape inference and P2P warm-up)."""
    state = ClusterState()
    for rank, result in enumerate(runs):
        layout = msgspec.msgpack.decode(result[name]["layout"], type=ParallelLayout)
        state.ingest(
            Hello(
                schema_version=SCHEMA_VERSION, job_id="j", rank=rank, world_size=2, parallel=layout
            )
        )
    out = []
    for step in range(len(runs[0][name]["steps"])):
        for rank, result in enumerate(runs):
            pipe = msgspec.msgpack.decode(result[name]["steps"][step], type=PipelineStep)
            report = StepReport(
                rank=rank, step=step + 1, wall_ns=1, duration_s=pipe.step_s, pipeline=pipe
            )
            state.ingest(report, received_s=0.0)
        if step:
            view = pipeline_view(state.ranks.values())
            assert view is not None
            out.append(view)
    return out


@pytest.mark.slow
def test_balanced_stages_bubble_as_planned(runs: list[dict[str, Any]]) -> None:
    assert runs[0]["balanced"]["parts"] == [0, 2, 4]
    for view in views(runs, "balanced"):
        assert view.schedule == "Schedule1F1B" and view.microbatches == 4
        assert view.bound == pytest.approx(0.2)
        for row in view.rows:
            assert row.planned_bubble == pytest.approx(0.2)
            assert len(row.actions) == 8 and {a.kind for a in row.actions} == {"F", "B"}
            assert row.compute_s == pytest.approx(8 * 2 * UNIT, rel=0.15)
            assert row.bubble_fraction == pytest.approx(row.planned_bubble, abs=0.07), row
        assert view.imbalance == pytest.approx(1.0, abs=0.1)


@pytest.mark.slow
def test_unbalanced_stages_show_the_imbalance(runs: list[dict[str, Any]]) -> None:
    for view in views(runs, "unbalanced"):
        fast = view.rows[1]
        assert view.slowest.pp == 0 and view.imbalance == pytest.approx(1.5, abs=0.15)
        assert fast.planned_bubble == pytest.approx(0.2)
        assert fast.bubble_fraction is not None and fast.bubble_fraction > 0.55
        for row in view.rows:
            assert row.bubble_fraction == pytest.approx(row.predicted_bubble, abs=0.07), row


@pytest.mark.slow
def test_profile_partition_follows_measured_time(runs: list[dict[str, Any]]) -> None:
    assert runs[0]["profile"]["parts"] == runs[1]["profile"]["parts"] == [0, 1, 4]
