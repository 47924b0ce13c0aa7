"""A step's loss and grad norm on CPU: read by the sender thread, never wrong, never a graph held.

The training thread keeps a CPU tensor outside autograd and the sender reads it (agent/scalars.py,
the agent's overhead budget); the answers here are the tensors' own values, read independently with ``.item()``.
"""

from __future__ import annotations

import gc
import weakref

import torch

from tests.test_agent_timeline import Sink
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.scalars import DeferredScalar
from zeroscope.agent.schema import MemoryBytes, StepReport


def test_a_cpu_tensor_is_read_when_the_sender_asks() -> None:
    loss = torch.tensor(1.25)
    kept = DeferredScalar(loss)
    assert kept.value is None  # not read on the training thread
    assert kept.ready()
    assert kept.value == loss.item()
    assert kept.host is None  # let go once read


def test_a_tensor_changed_in_place_before_the_read_is_missing_not_wrong() -> None:
    loss = torch.tensor(3.0)
    kept = DeferredScalar(loss)
    loss.mul_(2)  # the caller reuses its tensor before the sender got to it
    assert kept.ready()
    assert kept.value is None


def test_a_tensor_in_a_graph_is_read_at_once_and_not_held() -> None:
    w = torch.ones(3, requires_grad=True)
    loss = (w * 2).sum()
    expected = loss.item()
    kept = DeferredScalar(loss)
    assert kept.value == expected
    held = weakref.ref(loss)
    del loss
    gc.collect()
    assert held() is None  # the graph it roots is the caller's to free


def test_an_unreadable_tensor_is_missing_and_never_raises() -> None:
    kept = DeferredScalar(torch.empty((), device="meta"))  # no value to read, ever
    assert kept.ready()
    assert kept.value is None


def test_many_elements_and_plain_numbers() -> None:
    norms = torch.tensor([0.5, 9.0])
    kept, number = DeferredScalar(norms), DeferredScalar(7)
    assert kept.ready() and number.ready()
    assert (kept.value, number.value) == (norms[0].item(), 7.0)


def test_the_report_carries_the_values_given_and_none_for_a_reused_tensor() -> None:
    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    tel.sampler.stop()  # the sender's reads happen in this thread's drain below, not before
    try:
        loss, norm = torch.tensor(0.75), torch.tensor([4.0])
        tel.step_end(memory=MemoryBytes(), loss=loss, grad_norm=norm)
        reused = torch.tensor(1.5)
        tel.step_end(memory=MemoryBytes(), loss=reused)
        reused.add_(1.0)  # before the sender's drain below: its value is gone
        tel.drain()
    finally:
        tel.close()
    reports = [m for m in sink.sent if isinstance(m, StepReport)]
    assert [(r.step, r.loss, r.grad_norm) for r in reports] == [(1, 0.75, 4.0), (2, None, None)]
