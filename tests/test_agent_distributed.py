"""Tier 2: two gloo ranks running a hand-written data-parallel loop with the live agent on,
reporting to a real recording collector; the trace is checked against formulas and against
independent counters taken by the loop itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.distributed import free_port, run_ranks
from zeroscope.agent.schema import Bye, Event, MemoryBytes, StepReport
from zeroscope.collector.server import Collector, wait_for
from zeroscope.store.trace import TraceReader

ROOT = Path(__file__).resolve().parent.parent
B, D, H = 4, 8, 16


def saved_bytes_of_one_forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> int:
    """The test's own saved-tensor count: distinct non-parameter storages (done on a separate
    pass, because only the innermost saved_tensors_hooks sees the tensors)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not isinstance(base, nn.Parameter):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.mse_loss(model(x), y)
    del loss
    return sum(storages.values())


def dp_loop(
    rank: int,
    world: int,
    address: str | None,
    steps: int,
    pause: float = 0.0,
    gate: tuple[int, str] | None = None,
) -> dict[str, Any]:
    """Plain data parallelism: all-reduce every gradient through tel.collective, a fake fp16
    loss scaler that overflows at step 2, Adam. With ``gate=(step, path)`` the loop waits at
    that step until the file exists (sleeping changes no number)."""
    from zeroscope.agent import api

    if address:
        os.environ[api.COLLECTOR_ENV] = address
        os.environ["ZEROSCOPE_JOB_ID"] = "dp-test"
    api.set_telemetry(None)
    tel = api.telemetry()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    from zeroscope.agent.schema import ConfigSummary, ParamCounts

    numel = sum(p.numel() for p in model.parameters())
    tel.hello(
        config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
        params=ParamCounts(total=numel, trainable=numel),
    )
    gen = torch.Generator().manual_seed(100 + rank)
    data = [
        (torch.randn(B, D, generator=gen), torch.randn(B, 1, generator=gen)) for _ in range(steps)
    ]
    expected_a = saved_bytes_of_one_forward(model, *data[0])
    losses, comm_bound = [], []
    scale = 65536.0
    for step, (x, y) in enumerate(data, start=1):
        with tel.phase("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with tel.phase("backward"):
            loss.backward()
        overflow = step == 2
        if overflow:
            scale /= 2
            tel.event("overflow", "grad overflow, step skipped", value=scale)
            tel.event("scale_change", "loss scale halved", value=scale)
        t_issue = time.perf_counter()
        handles = [
            tel.collective(
                dist.all_reduce(p.grad, async_op=True),
                op="all_reduce",
                nbytes=p.grad.numel() * p.grad.element_size(),
                group_size=world,
            )
            for p in model.parameters()
        ]
        for h in handles:
            h.wait()
        comm_bound.append(time.perf_counter() - t_issue)
        with tel.phase("optimizer"):
            for p in model.parameters():
                p.grad /= world
            if not overflow:
                opt.step()
            opt.zero_grad()
        opt_state = sum(
            t.numel() * t.element_size()
            for s in opt.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        )
        tel.step_end(
            memory=MemoryBytes(params=numel * 4, grads=numel * 4, optim=opt_state),
            loss=loss.detach(),
            lr=1e-2,
            grad_norm=torch.tensor(1.0),
            loss_scale=scale,
            overflow=overflow,
            skipped=overflow,
            samples=B,
        )
        losses.append(loss.item())
        if pause:
            time.sleep(pause)
        if gate is not None and step == gate[0]:
            while not os.path.exists(gate[1]):
                time.sleep(0.01)
    tel.close()
    return {
        "losses": losses,
        "activations": expected_a,
        "comm_bound": comm_bound,
        "numel": numel,
        "grad_bytes": [p.numel() * 4 for p in model.parameters()],
    }


def test_two_ranks_trace_matches_the_loop(tmp_path: Path) -> None:
    steps = 4
    byes: list[Bye] = []
    col = Collector(record=tmp_path / "dp.zst")
    col.add_listener(lambda m: byes.append(m) if isinstance(m, Bye) else None)
    with col:
        results = run_ranks(dp_loop, 2, col.ingest_address, steps)
        assert wait_for(lambda: len(byes) == 2)
    with TraceReader(tmp_path / "dp.zst") as trace:
        hellos = trace.hellos()
        assert [h.rank for h in hellos] == [0, 1]
        assert all(h.job_id == "dp-test" and h.world_size == 2 for h in hellos)
        assert trace.count("hello") == 2
        assert trace.steps() in ((0, steps), (1, steps))  # heartbeats before step 1 say 0
        for rank, res in enumerate(results):
            reps = [m for m in trace.messages(ranks=[rank], kinds=["step"])]
            assert [r.step for r in reps] == list(range(1, steps + 1))
            for r, bound in zip(reps, res["comm_bound"]):
                assert isinstance(r, StepReport)
                assert r.memory.params == r.memory.grads == res["numel"] * 4
                assert r.memory.activations == res["activations"]
                assert [c.nbytes for c in r.collectives] == res["grad_bytes"]
                assert {(c.op, c.group_size) for c in r.collectives} == {("all_reduce", 2)}
                for c in r.collectives:
                    # Issue -> completion lies inside the loop's own issue -> last-wait window.
                    assert 0 <= c.exposed_s <= c.duration_s <= bound
                assert r.phases.forward and r.phases.backward and r.phases.optimizer
            assert [r.loss for r in reps] == res["losses"]
            assert [r.overflow for r in reps] == [False, True, False, False]
            # Adam's m and v, plus one fp32 step counter per parameter tensor, after a real step.
            assert reps[2].memory.optim == 2 * res["numel"] * 4 + 4 * len(res["grad_bytes"])
            events = [m for m in trace.messages(ranks=[rank], kinds=["event"])]
            assert [(e.event, e.step, e.value) for e in events if isinstance(e, Event)] == [
                ("overflow", 2, 32768.0),
                ("scale_change", 2, 32768.0),
            ]
            (bye,) = trace.messages(ranks=[rank], kinds=["bye"])
            assert isinstance(bye, Bye) and bye.exit_code == 0 and bye.step == steps


COLLECTOR = """
import sys, time
from zeroscope.collector.server import Collector
c = Collector(port=int(sys.argv[1]), record=sys.argv[2]).start()
print(c.ingest_address, flush=True)
while True:
    time.sleep(1)
"""


def start_collector(port: int, record: Path) -> tuple[subprocess.Popen[str], str]:
    """A collector process on ``port``, returned once it listens, with its ingest address.

    A restarted collector binds the port its killed predecessor held while that one's closed
    connections may still linger there in the kernel; a bind refused for that ("Address already
    in use") is retried for a while, as a user would restart it. Any other failure to start
    fails the test with the collector's own error (it once failed silently: the job then ran
    on without a collector and the test only saw an empty trace)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    deadline = time.monotonic() + 60
    while True:
        with tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", COLLECTOR, str(port), str(record)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )
            assert proc.stdout is not None
            address = proc.stdout.readline().strip()
            if address:
                return proc, address
            proc.wait()
            err.seek(0)
            error = err.read()
        assert "Address already in use" in error and time.monotonic() < deadline, error
        time.sleep(0.5)


def last_step(path: Path) -> int:
    try:
        with TraceReader(path) as r:
            return (r.steps() or (0, 0))[1]
    except Exception:
        return 0


@pytest.mark.slow
def test_killing_the_collector_never_hurts_training_and_reporting_resumes(
    tmp_path: Path,
) -> None:
    steps = 30
    reference = run_ranks(dp_loop, 2, None, steps)
    port = free_port()
    first, address = start_collector(port, tmp_path / "a.zst")
    second = None
    results: list[Any] = []
    gate = tmp_path / "collector-restarted"
    runner = threading.Thread(
        target=lambda: results.extend(run_ranks(dp_loop, 2, address, steps, 0.1, (10, str(gate))))
    )
    runner.start()
    try:
        assert wait_for(lambda: last_step(tmp_path / "a.zst") >= 5, 60, interval=0.1)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        time.sleep(0.3)
        second, _ = start_collector(port, tmp_path / "b.zst")
        gate.touch()
        runner.join(120)
        assert len(results) == 2
        b = tmp_path / "b.zst"

        def byes() -> int:
            try:
                with TraceReader(b) as r:
                    return r.count("bye")
            except Exception:
                return 0

        assert wait_for(lambda: byes() == 2, 10, interval=0.1)
    finally:
        runner.join(1)
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # Training did not notice: the losses are bit-identical to a run without zeroscope.
    assert [r["losses"] for r in results] == [r["losses"] for r in reference]
    killed_at = last_step(tmp_path / "a.zst")
    assert 5 <= killed_at < steps
    with TraceReader(tmp_path / "b.zst") as r:
        assert [h.rank for h in r.hellos()] == [0, 1]  # the sticky Hello was re-sent
        for rank in (0, 1):
            got = [m.step for m in r.messages(ranks=[rank], kinds=["step"])]
            assert got and got[-1] == steps and got == list(range(got[0], steps + 1))
            assert got[0] > killed_at
