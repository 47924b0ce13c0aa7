"""Tier 3: the bundled engine (stage 2, fp16) on two gloo ranks with the live agent reporting
to a real recording Collector through ZEROSCOPE_COLLECTOR; the trace is checked, then
summarized and exported from the file alone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.distributed import run_ranks
from tests.models import TinyGPT, batches
from zeroscope.agent.schema import Bye, Event, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.commands.export import chrome_events
from zeroscope.commands.summary import summarize
from zeroscope.store.trace import TraceReader

STEPS = 6
CONFIG = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
    # A start scale of 2^24 overflows fp16 gradients: the first steps are skipped and the scale
    # halves, so the trace must hold overflow and scale_change events.
    "fp16": {"enabled": True, "initial_scale_power": 24, "hysteresis": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
}


def train(rank: int, world: int, address: str) -> dict[str, Any]:
    import torch

    from zeroscope.agent import api
    from zeroscope.engine.api import initialize

    os.environ[api.COLLECTOR_ENV] = address
    os.environ["ZEROSCOPE_JOB_ID"] = "engine-e2e"
    api.set_telemetry(None)
    torch.manual_seed(0)
    engine, _, _, _ = initialize(model=TinyGPT(), config=dict(CONFIG))
    losses, skipped = [], []
    for x, y in batches(STEPS, 2 * world, seed=3):
        loss = engine(x[2 * rank : 2 * rank + 2], y[2 * rank : 2 * rank + 2])
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    skipped = engine.skipped_steps
    api.telemetry().close()
    return {"losses": losses, "skipped": skipped}


def test_engine_run_is_recorded_whole(tmp_path: Path) -> None:
    path = tmp_path / "engine.zst"
    byes: list[Bye] = []
    col = Collector(record=path)
    col.add_listener(lambda m: byes.append(m) if isinstance(m, Bye) else None)
    with col:
        results = run_ranks(train, 2, col.ingest_address)
        assert wait_for(lambda: len(byes) == 2)
    assert col.rejected == {} and col.dropped_by_agents == 0
    with TraceReader(path) as trace:
        hellos = trace.hellos()
        assert [h.rank for h in hellos] == [0, 1] and trace.count("hello") == 2
        assert all(
            h.job_id == "engine-e2e"
            and h.config is not None
            and h.config.stage == 2
            and h.config.precision == "fp16"
            and h.params is not None
            and h.params.total > 0
            for h in hellos
        )
        for rank, res in enumerate(results):
            reps = [m for m in trace.messages(ranks=[rank], kinds=["step"])]
            assert all(isinstance(r, StepReport) for r in reps)
            assert [r.step for r in reps] == list(range(1, STEPS + 1))
            # The engine reports the mean loss of the step; with one micro-batch it is the
            # loss the loop saw, and the fp16 loss cast keeps it within fp16 rounding.
            for r, loss in zip(reps, res["losses"]):
                assert r.loss is not None and abs(r.loss - loss) <= 1e-3 * abs(loss)
            overflowed = [r.step for r in reps if r.overflow]
            assert len(overflowed) == res["skipped"] >= 1
            assert all(r.loss_scale is not None for r in reps)
            for r in reps:
                m = r.memory
                assert m.params > 0 and m.grads > 0 and m.optim > 0
                assert m.activations is not None and m.activations > 0
                assert r.collectives and {c.group_size for c in r.collectives} == {2}
                assert all(0 <= c.exposed_s <= c.duration_s for c in r.collectives)
            events = [e for e in trace.messages(ranks=[rank], kinds=["event"])]
            kinds = [e.event for e in events if isinstance(e, Event)]
            assert kinds.count("overflow") == len(overflowed)
            assert "scale_change" in kinds
            (bye,) = trace.messages(ranks=[rank], kinds=["bye"])
            assert isinstance(bye, Bye) and bye.exit_code == 0
    summary = summarize(path)
    assert summary["total"]["steps"] == STEPS
    assert summary["total"]["overflows"] == results[0]["skipped"]
    assert all(r["comm_bytes_per_step"] and r["busbw_bytes_s"] for r in summary["ranks"])
    events = chrome_events(path)
    json.dumps(events)
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
