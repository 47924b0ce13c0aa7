"""A torch loss scaler's step, finished by the agent's sender thread (agent/loss_scale.py):
the training thread hands over the scale before and after and the skip flag (a value, or a
tensor the sender reads), and the report and its loss-scale events come out of the sender's
drain. Answers: a real ``torch.amp.GradScaler("cpu")``'s own ``get_scale()`` and
``found_inf``, read by the test."""

from __future__ import annotations

import torch

from tests.test_agent_timeline import Sink
from zeroscope.agent.attach.grad_scaler import snapshot
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.loss_scale import LossScaleReading
from zeroscope.agent.scalars import DeferredScalar
from zeroscope.agent.schema import Event, MemoryBytes, StepReport


def _scaler_step(scaler: torch.amp.GradScaler, grad: float) -> tuple[LossScaleReading, bool]:
    """One scaler step on a one-parameter SGD whose gradient is ``grad`` (inf: overflow),
    taken the way the attach takes it: scale at ``step()``, flags summed, scale after."""
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    w.grad.fill_(grad)
    before = snapshot(scaler._scale)
    scaler.step(opt)
    flags = scaler._found_inf_per_device(opt)
    found = bool(sum(f.item() for f in flags.values()))  # the test's own read
    skipped = snapshot(sum(flags.values()))
    scaler.update()
    return LossScaleReading(before, snapshot(scaler._scale), skipped), found


def _drain(readings: list[LossScaleReading]) -> tuple[list[StepReport], list[Event]]:
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    tel.sampler.stop()  # the reads happen in this thread's drain below, not before
    try:
        for reading in readings:
            tel.step_end(memory=MemoryBytes(), loss_scale=reading)
        tel.drain()
    finally:
        tel.close()
    reports = [m for m in sink.sent if isinstance(m, StepReport)]
    return reports, [m for m in sink.sent if isinstance(m, Event)]


def test_a_snapshot_survives_the_scalers_in_place_update() -> None:
    scale = torch.tensor(1024.0)
    kept = snapshot(scale)
    scale.mul_(0.5)  # what update() does to its CPU scale
    assert kept.ready() and kept.value == 1024.0


def test_overflow_and_growth_reported_with_the_scalers_own_values() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=1)
    clean, clean_found = _scaler_step(scaler, 0.5)
    grown = scaler.get_scale()
    inf, inf_found = _scaler_step(scaler, float("inf"))
    backed = scaler.get_scale()
    assert (clean_found, inf_found) == (False, True) and grown == 512.0 and backed == 256.0
    reports, events = _drain([clean, inf])
    assert [(r.step, r.loss_scale, r.overflow, r.skipped) for r in reports] == [
        (1, grown, False, False),
        (2, backed, True, True),
    ]
    assert [(e.step, e.event, e.value) for e in events] == [
        (1, "scale_change", grown),
        (2, "overflow", grown),  # the scale the overflowing backward used
        (2, "scale_change", backed),
    ]
    assert events[1].message == "gradient overflow at loss scale 512: step skipped"


def test_an_overflow_that_cannot_lower_the_scale_is_at_minimum() -> None:
    """The scale pinned by ``update(new_scale)``: the overflow left it where it was."""
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    w = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler.scale(w.sum()).backward()
    w.grad.fill_(float("nan"))
    before = snapshot(scaler._scale)
    scaler.step(opt)
    skipped = snapshot(sum(scaler._found_inf_per_device(opt).values()))
    scaler.update(8.0)
    reports, events = _drain([LossScaleReading(before, snapshot(scaler._scale), skipped)])
    assert [(r.loss_scale, r.skipped) for r in reports] == [(scaler.get_scale(), True)]
    assert [(e.event, e.value) for e in events] == [("overflow", 8.0), ("scale_at_minimum", 8.0)]


def test_tensors_handed_over_are_read_by_the_sender_and_a_host_skip_needs_no_flag() -> None:
    reading = LossScaleReading(
        DeferredScalar(torch.tensor(4.0)), DeferredScalar(torch.tensor(2.0)), True
    )
    assert reading.before.value is None and reading.after.value is None  # not read yet
    reports, events = _drain([reading])
    assert [(r.loss_scale, r.overflow) for r in reports] == [(2.0, True)]
    assert [e.event for e in events] == ["overflow", "scale_change"]
