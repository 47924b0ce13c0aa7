"""Tier 1: the live agent in one process, against formulas and independent clocks, publishing
to a real collector."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.distributed import connected_publisher
from zeroscope.agent import api
from zeroscope.agent.cadence import ActivationCadence
from zeroscope.agent.live import LiveTelemetry
from zeroscope.agent.schema import Bye, Event, Hello, MemoryBytes, Message, StepReport
from zeroscope.collector.server import Collector, wait_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rig() -> Iterator[tuple[LiveTelemetry, list[Message]]]:
    got: list[Message] = []
    col = Collector()
    col.add_listener(got.append)
    with col:
        tel = LiveTelemetry(
            connected_publisher(col.ingest_address), job_id="t", sample_interval=0.2
        )
        from zeroscope.agent.schema import ConfigSummary, ParamCounts

        tel.hello(
            config=ConfigSummary(stage=0, precision="fp32", dp_world_size=1),
            params=ParamCounts(total=1, trainable=1),
        )
        assert wait_for(lambda: any(isinstance(m, Hello) for m in got))
        yield tel, got
        tel.close()
        assert wait_for(lambda: any(isinstance(m, Bye) for m in got))


def reports(got: list[Message]) -> list[StepReport]:
    return [m for m in got if isinstance(m, StepReport)]


def test_activation_bytes_match_the_formula(rig: tuple[LiveTelemetry, list[Message]]) -> None:
    tel, got = rig
    B, d, h = 8, 16, 32
    model = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, 1))
    x, target = torch.randn(B, d), torch.randn(B, 1)
    for _ in range(2):
        with tel.phase("forward"):
            loss = nn.functional.mse_loss(model(x), target)
        with tel.phase("backward"):
            loss.backward()
        assert tel._activations.live == 0  # backward released every saved tensor
        tel.step_end(memory=MemoryBytes(params=123), loss=loss)
    assert wait_for(lambda: len(reports(got)) == 2)
    # Saved for backward, fp32: the input x (first Linear's weight grad), the ReLU output
    # (saved by ReLU and by the second Linear: one storage, counted once), the MSE input and
    # target. The second Linear's weight is a parameter (P), not an activation.
    expected = 4 * (B * d + B * h + B + B)
    for r in reports(got):
        assert r.memory.activations == expected
        assert r.memory.params == 123
        assert r.loss is not None


def test_views_of_one_storage_count_once_and_peak_is_within_the_step(
    rig: tuple[LiveTelemetry, list[Message]],
) -> None:
    tel, got = rig
    w = nn.Parameter(torch.randn(4, 6))
    x = torch.randn(10, 4)
    with tel.phase("forward"):
        hmid = x @ w  # saves x (160 B); w is a parameter
        z = (hmid[:, :3] * hmid[:, 3:]).sum()  # saves two views of hmid's storage (240 B)
    with tel.phase("backward"):
        z.backward()
    tel.step_end(memory=MemoryBytes())
    # A step without forward: A is whatever the engine says (None = not measured).
    tel.step_end(memory=MemoryBytes())
    assert wait_for(lambda: len(reports(got)) == 2)
    first, second = reports(got)
    assert first.memory.activations == 10 * 4 * 4 + 10 * 6 * 4
    assert second.memory.activations is None


def test_activations_are_counted_on_sampled_steps_and_carried_between(
    rig: tuple[LiveTelemetry, list[Message]],
) -> None:
    """Counted on steps 1-3 and every N-th (N = 4 here); other steps carry the latest count and
    say which step it is from, so the hooks' per-tensor cost is paid on 1 step in N."""
    tel, got = rig
    tel._cadence = ActivationCadence(every=4)  # as ZEROSCOPE_ACTIVATIONS_EVERY=4 sets it
    w = nn.Parameter(torch.randn(4, 6))
    sizes = {}
    for step in range(1, 10):
        rows = step  # a different footprint every step: a carried value is recognisable
        x = torch.randn(rows, 4)
        with tel.phase("forward"):
            loss = (x @ w).pow(2).sum()  # saves x (rows*4*4 B) and x@w (rows*6*4 B)
        with tel.phase("backward"):
            loss.backward()
        sizes[step] = rows * 4 * 4 + rows * 6 * 4
        tel.step_end(memory=MemoryBytes())
    assert wait_for(lambda: len(reports(got)) == 9)
    seen = {r.step: (r.memory.activations, r.memory.activations_step) for r in reports(got)}
    measured = {1: 1, 2: 2, 3: 3, 4: 4, 5: 4, 6: 4, 7: 4, 8: 8, 9: 8}
    assert seen == {step: (sizes[at], at) for step, at in measured.items()}


def test_phases_against_an_independent_clock(rig: tuple[LiveTelemetry, list[Message]]) -> None:
    tel, got = rig
    t0 = time.perf_counter()
    tel.step_end(memory=MemoryBytes())
    time.sleep(0.05)  # the "data loader"
    with tel.phase("forward"):
        t1 = time.perf_counter()
        time.sleep(0.02)
    with tel.phase("backward"):
        time.sleep(0.03)
    t2 = time.perf_counter()
    tel.step_end(memory=MemoryBytes(), loss=torch.tensor(2.5), grad_norm=torch.tensor([0.5]))
    t3 = time.perf_counter()
    assert wait_for(lambda: len(reports(got)) == 2)
    r = reports(got)[1]
    assert r.phases.data is not None and t1 - t0 >= r.phases.data >= 0.05
    assert r.phases.forward is not None and 0.02 <= r.phases.forward <= t2 - t1
    assert r.phases.backward is not None and r.phases.backward >= 0.03
    assert r.phases.optimizer is None  # not observed: NA, not 0
    assert 0.1 <= r.duration_s <= t3 - t0
    assert (r.loss, r.grad_norm) == (2.5, 0.5)
    assert r.step == 2


def test_events_go_out_at_once_and_nan_loss_is_flagged(
    rig: tuple[LiveTelemetry, list[Message]],
) -> None:
    tel, got = rig
    tel.event("overflow", "grad overflow, step skipped", value=32768.0)
    assert wait_for(lambda: any(isinstance(m, Event) for m in got))  # before any step_end
    ev = next(m for m in got if isinstance(m, Event))
    assert (ev.event, ev.value, ev.step) == ("overflow", 32768.0, 1)
    tel.step_end(memory=MemoryBytes(), loss=float("nan"), overflow=True, skipped=True)
    assert wait_for(lambda: len(reports(got)) == 1)
    kinds = [m.event for m in got if isinstance(m, Event)]
    assert kinds == ["overflow", "nan_loss"]
    assert reports(got)[0].overflow and reports(got)[0].skipped


def test_transfers_and_heartbeats(rig: tuple[LiveTelemetry, list[Message]]) -> None:
    tel, got = rig
    t0 = time.perf_counter_ns()
    tel.transfer("d2h", 4096, t0, t0 + 2_000_000, label="grads")
    tel.step_end(memory=MemoryBytes())
    assert wait_for(lambda: len(reports(got)) == 1)
    (tr,) = reports(got)[0].transfers
    assert (tr.direction, tr.nbytes, tr.duration_s, tr.label) == ("d2h", 4096, 0.002, "grads")
    from zeroscope.agent.schema import Heartbeat

    assert wait_for(lambda: any(isinstance(m, Heartbeat) for m in got), 5)
    hb = next(m for m in got if isinstance(m, Heartbeat))
    assert hb.host is not None and hb.host.rss_bytes and hb.host.rss_bytes > 0
    if not torch.cuda.is_available():
        assert hb.host.gpu_util_percent is None and hb.host.gpu_power_w is None


def test_heartbeats_leave_with_the_reports(rig: tuple[LiveTelemetry, list[Message]]) -> None:
    """The sampler's heartbeat joins the outbox just before it drains: one ZeroMQ message
    carries it and the reports (one wake-up of ZeroMQ's I/O thread, not two; the agent's overhead budget), the
    heartbeat after them: it names the last step ended, and a trace cut short mid-batch (a
    full disk) must not name a step whose report it lacks."""
    from zeroscope.agent.schema import Heartbeat

    tel, _ = rig
    publisher = tel.publisher
    batches: list[list[type]] = []
    steps: list[tuple[int, int]] = []  # (the batch's last report's step, its heartbeat's)
    alone: list[type] = []
    send, send_batch = publisher.send, publisher.send_batch

    def record_batch(messages: list[Message]) -> int:
        batches.append([type(m) for m in messages])
        if isinstance(messages[-1], Heartbeat):
            reports = [m.step for m in messages if isinstance(m, StepReport)]
            if reports:
                steps.append((reports[-1], messages[-1].step))
        return send_batch(messages)

    def record_send(message: Message) -> bool:
        alone.append(type(message))
        return send(message)

    publisher.send_batch = record_batch
    publisher.send = record_send
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(
        Heartbeat in b and StepReport in b for b in batches
    ):
        tel.step_end(memory=MemoryBytes())
        time.sleep(0.01)
    assert any(Heartbeat in b and StepReport in b for b in batches), batches
    assert all(b[-1] is Heartbeat for b in batches if Heartbeat in b), batches
    assert steps and all(beat <= last for last, beat in steps), steps
    assert Heartbeat not in alone


def test_the_agent_never_raises_into_the_loop(rig: tuple[LiveTelemetry, list[Message]]) -> None:
    tel, got = rig
    tel.step_end(memory=None)  # type: ignore[arg-type]
    tel.transfer("d2h", "x", None, None)  # type: ignore[arg-type]
    tel.transfer("d2h", 4096, 10, 20)
    assert tel.errors == 1
    tel.step_end(memory=MemoryBytes())
    tel.drain()
    # The bad transfer is left out by the sender (counted there), the good one and the
    # step's report still go out.
    assert tel._outbox.errors == 1
    assert wait_for(lambda: reports(got), 5)
    (report,) = reports(got)
    assert [t.nbytes for t in report.transfers] == [4096]
    # The loop's own exceptions pass through phase().
    with pytest.raises(KeyError), tel.phase("forward"):
        raise KeyError("user error")


def test_without_a_collector_telemetry_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(api.COLLECTOR_ENV, raising=False)
    api.set_telemetry(None)
    try:
        tel = api.telemetry()
        assert isinstance(tel, api.NullTelemetry) and not tel.enabled
        work = object()
        assert tel.collective(work, op="all_reduce", nbytes=1, group_size=2) is work  # type: ignore[arg-type]
    finally:
        api.set_telemetry(None)


SCRIPT = """
import sys
from zeroscope.agent import api
from zeroscope.agent.schema import MemoryBytes
tel = api.telemetry()
assert tel.enabled
tel.step_end(memory=MemoryBytes(params=7))
if sys.argv[1] == "raise":
    raise ValueError("the user's bug")
"""


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_exit_sends_bye_and_an_uncaught_error_keeps_its_traceback(mode: str) -> None:
    got: list[Message] = []
    col = Collector()
    col.add_listener(got.append)
    with col:
        env = {**os.environ, "PYTHONPATH": str(ROOT), api.COLLECTOR_ENV: col.ingest_address}
        proc = subprocess.run(
            [sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True, text=True
        )
        assert wait_for(lambda: any(isinstance(m, Bye) for m in got))
    bye = next(m for m in got if isinstance(m, Bye))
    if mode == "raise":
        assert proc.returncode == 1
        assert "Traceback" in proc.stderr and "ValueError: the user's bug" in proc.stderr
        (err,) = [m for m in got if isinstance(m, Event)]
        assert (err.event, err.message) == ("error", "ValueError: the user's bug")
        assert (bye.exit_code, bye.message) == (1, "ValueError: the user's bug")
    else:
        assert proc.returncode == 0, proc.stderr
        assert bye.exit_code == 0
    assert bye.step == 1
    assert [m.memory.params for m in got if isinstance(m, StepReport)] == [7]


class _SlowWork:
    """A Work whose future completes when the test says so (an op still in flight)."""

    def __init__(self) -> None:
        self.fut: torch.futures.Future = torch.futures.Future()

    def get_future(self) -> torch.futures.Future:
        return self.fut

    def wait(self) -> None:
        self.fut.wait()


def test_a_collective_in_flight_at_step_end_stays_in_its_own_step(
    rig: tuple[LiveTelemetry, list[Message]],
) -> None:
    tel, got = rig
    slow, fast = _SlowWork(), _SlowWork()
    h_slow = tel.collective(slow, op="all_gather", nbytes=100, group_size=2, label="slow")
    h_fast = tel.collective(fast, op="reduce_scatter", nbytes=50, group_size=2, label="fast")
    fast.fut.set_result(None)
    h_fast.wait()
    tel.step_end(memory=MemoryBytes())  # the all-gather is still in flight
    time.sleep(0.01)
    slow.fut.set_result(None)  # completes between steps, never waited for: exposed 0
    tel.step_end(memory=MemoryBytes())
    tel.step_end(memory=MemoryBytes())
    assert wait_for(lambda: len(reports(got)) == 3)
    first, second, third = reports(got)
    # Step 1's report waited for its all-gather: both collectives, on step 1's own axis.
    assert [c.label for c in first.collectives] == ["slow", "fast"]
    late = first.collectives[0]
    assert late.exposed_s == 0.0 and late.start_s >= 0 and late.duration_s >= 0.01
    assert first.collectives_unfinished == 0
    assert second.collectives == [] and third.collectives == []
    del h_slow
