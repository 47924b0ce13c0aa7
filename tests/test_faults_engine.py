"""Tier 1 faults inside the engine (one process, no process group):

- an fp16 gradient overflow never touches the fp32 master weights, the Adam moments or the
  model's parameters: all bitwise equal after the skipped step, at every stage;
- a NaN loss is reported as an event ``nan_loss`` carrying its step and rank, through the real
  agent and collector into the trace (and training is not stopped by the profiler).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.distributed import connected_publisher
from tests.models import TinyGPT, batches
from zeroscope.agent.api import set_telemetry
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.schema import Bye, Event, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.engine.api import initialize
from zeroscope.store.trace import TraceReader


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    set_telemetry(None)


def fp16_config(stage: int) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": stage},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "fp16": {"enabled": True, "initial_scale_power": 8, "hysteresis": 1},
    }


def snapshot(engine: object) -> list[torch.Tensor]:
    """Every byte the optimizer step could change: masters, Adam state, module parameters."""
    out: list[torch.Tensor] = []
    for shard in engine.strategy.shards:  # type: ignore[attr-defined]
        out.append(shard.master.detach().clone())
        state = shard.state
        fields = (
            [getattr(state, f.name) for f in dataclasses.fields(state)]
            if dataclasses.is_dataclass(state)
            else list(vars(state).values())
        )
        out += [v.detach().clone() for v in fields if isinstance(v, torch.Tensor)]
        out += [torch.tensor(float(v)) for v in fields if isinstance(v, int | float)]
    out += [p.detach().clone() for p in engine.module.parameters()]  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_an_fp16_overflow_never_changes_master_weights_bitwise(stage: int) -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    engine, *_ = initialize(model=model, config=fp16_config(stage))
    data = batches(4, 2, seed=1)
    for x, y in data[:2]:  # real steps first: the Adam moments are non-zero
        engine.backward(engine(x, y))
        engine.step()
    assert engine.skipped_steps == 0
    before = snapshot(engine)
    scale = engine.loss_scale
    poisoned = next(engine.module.parameters())
    hook = poisoned.register_hook(lambda g: torch.full_like(g, float("inf")))
    x, y = data[2]
    engine.backward(engine(x, y))
    engine.step()
    hook.remove()
    assert engine.skipped_steps == 1 and engine.loss_scale == scale / 2
    after = snapshot(engine)
    assert len(after) == len(before) > 0
    for a, b in zip(after, before):
        assert a.dtype == b.dtype and torch.equal(
            a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
        )
    # ... and the next clean step trains again.
    x, y = data[3]
    engine.backward(engine(x, y))
    engine.step()
    assert not all(torch.equal(a, b) for a, b in zip(snapshot(engine), before))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_nan_loss_is_an_event_with_its_step_and_rank(precision: str, tmp_path: Path) -> None:
    trace = tmp_path / "nan.zstrace"
    rank = 0
    with Collector(record=trace) as col:
        tel = LiveTelemetry(connected_publisher(col.ingest_address), job_id="nan", rank=rank)
        set_telemetry(tel)
        cfg: dict[str, object] = {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        }
        if precision == "fp16":
            cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
        torch.manual_seed(0)
        engine, *_ = initialize(model=TinyGPT(), config=cfg)
        for step, (x, y) in enumerate(batches(5, 2, seed=2), start=1):
            loss = engine(x, y)
            if step == 3:
                loss = loss * float("nan")
            engine.backward(loss)
            engine.step()
        tel.close()
        assert wait_for(lambda: col.accepted > 0 and (trace_has_bye(col)), 10)
    with TraceReader(trace) as r:
        events = [m for m in r.messages(kinds=["event"]) if isinstance(m, Event)]
        nan = [e for e in events if e.event == "nan_loss"]
        # fp16 skips the step, so training recovers; fp32 applies NaN gradients, so every
        # later loss is NaN too (and each is reported).
        expected = [3] if precision == "fp16" else [3, 4, 5]
        assert [(e.step, e.rank) for e in nan] == [(s, rank) for s in expected]
        reports = [m for m in r.messages(kinds=["step"]) if isinstance(m, StepReport)]
        assert [m.step for m in reports] == [1, 2, 3, 4, 5]  # the profiler stopped nothing
        assert reports[2].loss != reports[2].loss  # the NaN itself is in the report
        if precision == "fp16":
            assert reports[2].overflow and reports[2].skipped
            assert ("overflow", 3) in [(e.event, e.step) for e in events]


def trace_has_bye(col: Collector) -> bool:
    from zeroscope.agent import schema

    return any(isinstance(schema.decode(p), Bye) for p in col._history[-5:])
