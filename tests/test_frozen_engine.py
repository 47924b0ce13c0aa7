"""Frozen parameters in the bundled engine's accounting, one process (no torchrun).

A LoRA-style model (a frozen base, small trainable adapters) under each stage and precision:
P must be the bytes of every parameter the rank holds, frozen or not, and the frozen share is
reported beside it; G and O follow the trainable parameters only. Oracles: the model's own
parameter list (numel x element size per dtype) and Adam's state (fp32 m and v, plus an fp32
master in 16-bit training). One rank: no padding, no partition, so the sums are exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.recorder import RecordingTelemetry
from zeroscope.agent.api import set_telemetry
from zeroscope.engine.api import initialize
from zeroscope.state.formulas import model_state_bytes, optimizer_bytes


class LoraLinear(torch.nn.Module):
    """A frozen ``base`` plus a trainable rank-``r`` update ``B @ A`` (LoRA's shape, by hand)."""

    def __init__(self, width: int, r: int) -> None:
        super().__init__()
        self.base = torch.nn.Linear(width, width)
        self.base.requires_grad_(False)
        self.lora_a = torch.nn.Parameter(torch.randn(r, width) * 0.1)
        self.lora_b = torch.nn.Parameter(torch.randn(width, r) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + x @ self.lora_a.t() @ self.lora_b.t()


def lora_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(LoraLinear(24, 2), torch.nn.GELU(), LoraLinear(24, 2))


@pytest.fixture(autouse=True)
def recorder() -> Iterator[RecordingTelemetry]:
    rec = RecordingTelemetry()
    set_telemetry(rec)
    yield rec
    set_telemetry(None)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_p_holds_frozen_parameters_g_and_o_only_trainable(
    recorder: RecordingTelemetry, stage: int, precision: str
) -> None:
    cfg: dict = {
        "train_batch_size": 4,
        # No persistent parameters at stage 3: every rank holds exactly its shard of each.
        "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    }
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    model = lora_model()
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    engine, *_ = initialize(model=model, config=cfg)
    data = torch.Generator().manual_seed(1)
    for _ in range(2):
        x = torch.randn(4, 24, generator=data)
        loss = engine(x.to(next(engine.module.parameters()).dtype)).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    b = 4 if precision == "fp32" else 2
    if stage < 3:  # the model's own list, after the engine's cast (stage 3: placeholders)
        held = sum(p.numel() * p.element_size() for p in model.parameters())
        assert held == b * (frozen + trainable)
    m = recorder.steps[-1].memory
    assert m.frozen_params == b * frozen
    assert m.params == b * (frozen + trainable)
    assert m.grads == b * trainable
    assert m.optim == optimizer_bytes(precision) * trainable
    predicted = model_state_bytes(frozen + trainable, 1, stage, precision, trainable=trainable)
    assert (m.params, m.grads, m.optim) == (predicted.params, predicted.grads, predicted.optim)
    params = recorder.hellos[-1]["params"]
    assert (params.total, params.trainable, params.frozen) == (
        frozen + trainable,
        trainable,
        frozen,
    )


def test_views_show_the_frozen_share_and_the_prediction_splits_psi() -> None:
    """The issue's LoRA (3,584 trainable of 128,960, fp32, ZeRO-2, 2 ranks) as wire messages:
    the step line, the summary and the memory prediction (zeroscope.state)."""
    from zeroscope.agent.schema import (
        SCHEMA_VERSION,
        ConfigSummary,
        Hello,
        MemoryBytes,
        ParamCounts,
        StepReport,
    )
    from zeroscope.state import ClusterState
    from zeroscope.state.lines import step_line, summary_lines
    from zeroscope.state.prediction import predicted_memory
    from zeroscope.state.report import run_report

    psi, t = 128_960, 3_584
    state = ClusterState()
    config = ConfigSummary(stage=2, precision="fp32", dp_world_size=2)
    for r in range(2):
        state.ingest(
            Hello(
                schema_version=SCHEMA_VERSION,
                job_id="lora",
                rank=r,
                world_size=2,
                config=config,
                params=ParamCounts(total=psi, trainable=t),
            )
        )
    memory = MemoryBytes(params=4 * psi, grads=4 * t // 2, optim=8 * t // 2)
    memory.frozen_params = 4 * (psi - t)
    for step in (1, 2):
        for r in range(2):
            state.ingest(
                StepReport(rank=r, step=step, wall_ns=step * 10**9, duration_s=1.0, memory=memory)
            )
    state.flush()
    line = step_line(state.complete_steps()[-1])
    assert "P 516KB (frozen 502KB) G 7.2KB O 14.3KB" in line
    assert any("P 516KB (frozen 502KB)" in x for x in summary_lines(state))
    report = run_report(state)
    assert [row["frozen_params_peak"] for row in report["ranks"]] == [4 * (psi - t)] * 2
    predicted, why = predicted_memory(state)
    assert predicted is not None and "(3,584 trainable)" in why
    assert (predicted.params, predicted.grads, predicted.optim) == (
        memory.params,
        memory.grads,
        memory.optim,
    )


def test_the_advisors_stage_prices_count_frozen_parameters_in_p_only() -> None:
    """The advisor prices another stage with the same split: a LoRA's frozen base stays in P
    (replicated below stage 3), its G and O are the adapters'."""
    from types import SimpleNamespace

    from zeroscope.agent.schema import ConfigSummary, ParamCounts
    from zeroscope.state.advice.rules_memory import states_at

    psi, t = 128_960, 3_584
    facts: Any = SimpleNamespace(
        config=ConfigSummary(stage=2, precision="fp32", dp_world_size=2),
        params=ParamCounts(total=psi, trainable=t),
    )
    s1, s3 = states_at(facts, 1), states_at(facts, 3)
    assert (s1.params, s1.grads, s1.optim) == (4 * psi, 4 * t, 8 * t / 2)
    assert (s3.params, s3.grads, s3.optim) == (4 * psi / 2, 4 * t / 2, 8 * t / 2)


def test_a_plain_optimizers_reader_counts_the_trainers_frozen_parameters() -> None:
    """Without a distributed engine the attach reads the optimizer; given the model (the HF
    Trainer's), the parameters the optimizer does not step are frozen P."""
    import weakref

    from zeroscope.agent.attach.census import Census
    from zeroscope.agent.attach.session import SESSION
    from zeroscope.agent.attach.torch_loop import OptimizerReader

    model = lora_model()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    frozen = sum(4 * p.numel() for p in model.parameters() if not p.requires_grad)
    every = sum(4 * p.numel() for p in model.parameters())
    reader = OptimizerReader(opt)
    before = SESSION.model
    try:
        census = Census()
        reader.count_state(census)
        assert (census.device["params"], census.frozen) == (every - frozen, None)  # no model
        SESSION.model = weakref.ref(model)
        census = Census()
        reader.count_state(census)
        assert (census.device["params"], census.frozen) == (every, frozen)
        _, counts, _ = reader.hello()
        assert (counts.total * 4, counts.trainable * 4) == (every, every - frozen)
    finally:
        SESSION.model = before
