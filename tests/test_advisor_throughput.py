"""Advice priced in time cites the run's tokens/s and MFU, and what the price makes of them;
NA with the reason where they were not measured. The run: rule 5's start-up overflow storm
(20 of 30 steps skipped, 50 ms each, 2 ranks) with a known work per rank and step, so the
figures follow by hand: tokens/s = 2 x tokens / 50 ms, MFU = 2 x FLOPs / (50 ms x 2 peaks),
and a step shorter by the price: both x step / (step - saved)."""

from __future__ import annotations

import pytest

from zeroscope.agent import schema
from zeroscope.state import ClusterState, units
from zeroscope.state.advice import Advice, advise

TOKENS, FLOPS, PEAK, STEP_S = 1024, 5e11, 1e14, 0.05


def _storm(work: schema.Work | None) -> ClusterState:
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
    scales = [2.0 ** (31 - i) for i in range(20)] + [2.0**12] * 10
    for i, scale in enumerate(scales):
        for rank in (0, 1):
            state.ingest(
                schema.StepReport(
                    rank=rank,
                    step=i + 1,
                    wall_ns=int((i + 1) * STEP_S * 1e9),
                    duration_s=STEP_S,
                    loss_scale=scale,
                    overflow=i < 20,
                    skipped=i < 20,
                    work=work,
                )
            )
    state.flush()
    return state


def _work(**kw: object) -> schema.Work:
    fields: dict[str, object] = dict(
        tokens=TOKENS,
        positions=TOKENS,
        seq_len=128,
        flops=FLOPS,
        peak_flops=PEAK,
        peak_source="datasheet H100 bf16 dense",
    )
    fields.update(kw)
    return schema.Work(**fields)  # type: ignore[arg-type]


def _fp16_advice(state: ClusterState) -> Advice:
    advice = next(a for a in advise(state).advice if a.rule == "fp16")
    assert advice.saves_ms == pytest.approx(20 * 50.0 / 30)  # rule 5's own price
    return advice


def test_time_priced_advice_cites_tokens_and_mfu_before_and_after() -> None:
    advice = _fp16_advice(_storm(_work()))
    line = advice.evidence[-1]
    tokens = 2 * TOKENS / STEP_S
    mfu = 2 * FLOPS / (STEP_S * 2 * PEAK)
    scale = STEP_S / (STEP_S - advice.saves_ms / 1e3)
    assert line.startswith(
        f"the run: {units.count(tokens)} tokens/s, MFU {units.fine_percent(mfu)} (steady steps)"
    )
    assert f"{units.count(tokens * scale)} tokens/s" in line
    assert f"MFU {units.fine_percent(mfu * scale)}" in line
    assert f"({100 * mfu * (scale - 1):+.2g} points)" in line
    assert "20 of 30 steps" in advice.evidence[0]  # the rule's own evidence first


def test_a_projection_past_the_peak_is_na() -> None:
    """At MFU 40 % a step a third as long would need 120 %: no ceiling is passed, NA instead."""
    line = _fp16_advice(_storm(_work(flops=4 * FLOPS))).evidence[-1]
    assert "MFU 40.0% (steady steps)" in line and "MFU NA (the projection passes the peak" in line


def test_unmeasured_figures_are_na_with_the_reason() -> None:
    line = _fp16_advice(_storm(None)).evidence[-1]
    assert line.startswith("the run's tokens/s and MFU: NA (") and "reported no tokens" in line
    off = _work(flops=None, na="FLOPs not counted: the count is off (ZEROSCOPE_FLOPS=0)")
    line = _fp16_advice(_storm(off)).evidence[-1]
    assert "MFU NA (FLOPs not counted: the count is off" in line
    assert f"{units.count(2 * TOKENS / STEP_S)} tokens/s" in line
