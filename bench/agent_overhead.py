"""Agent overhead: step time with the live agent on vs off, 2 gloo ranks, one run.

Goal: <= 1% more process CPU time with the agent on, and on the training thread at most ~30 us
per step plus ~2 us per collective (the agent's overhead budget, agent/cost.py), read from the agent's own counters
(agent/cost.py). Both modes run in the same processes, interleaved in rounds of blocks (on,
off, off-again, the order rotated every round so no mode always follows a switch), so machine
noise hits all alike; the figure is the median over rounds of the on/off ratio, printed beside
the off-again/off ratio of the same run (an A/A control: the noise floor of this machine).
The agent's own threads (its sender, ZeroMQ's I/O threads) run when they run, as in a real
run (reports leave in batches at most every 0.5 s, often during an "off" step): their CPU
time is read per thread (bench/thread_cpu.py) and taken out of every block, and each "on" step
is charged their CPU per step over a stretch of consecutive "on" steps measured first (a real
run's rate: interleaved, they would also pay heartbeats and timer wake-ups for three times the
wall time per "on" step; that upper bound is printed beside it). The "on" mode does everything the live agent does
in a real run: phases with saved-tensor hooks in counted forwards, every collective
through ``tel.collective``, a StepReport per step published to a real collector, the sampler
thread with heartbeats.

``--model mlp`` (the default) is a 3-layer MLP whose 6 gradients are all-reduced by hand;
``--model demo`` is the bundled engine at ZeRO stage 2 on the demo model (small steps);
``--model zero3`` is the engine at stage 3 on a deep MLP with nothing persistent (a gather per
layer in forward and in backward, a reduce-scatter per layer: hundreds of collectives per
step). One engine serves both modes, its telemetry switched between the live agent and the
no-op (bench/agent_engine.py).

Usage: ``python bench/agent_overhead.py [--model mlp|demo|zero3] [--blocks 600] [--steps 1]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rank_main(rank: int, world: int, port: int, address: str, args: Any, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    from torch import nn

    from bench.thread_cpu import ThreadsCpu, thread_ids
    from zeroscope.agent.api import NullTelemetry
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.publish import Publisher
    from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    before = thread_ids()  # the agent's threads are those started from here to hello
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(
        nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w), nn.GELU(), nn.Linear(w, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    numel = sum(p.numel() for p in model.parameters())
    publisher = Publisher(address)
    publisher.wait_connected(5.0)
    wire = [0]  # bytes the agent hands to ZeroMQ (token + payload frames), for bytes/rank-step
    send_locked = publisher._send_locked

    def counted(*payloads: bytes) -> bool:
        ok = send_locked(*payloads)
        if ok:
            wire[0] += sum(map(len, payloads)) + len(publisher._token)
        return ok

    publisher._send_locked = counted
    live = LiveTelemetry(publisher, rank=rank, world_size=world, job_id="bench")
    live.hello(
        config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
        params=ParamCounts(total=numel, trainable=numel),
    )
    agent_threads = ThreadsCpu(thread_ids() - before)
    off = NullTelemetry()
    if args.model != "mlp":
        from bench.agent_engine import engine_step

        step = engine_step(args, live, world)
        model = None
    _ablate(live, args.ablate)
    # The activation count's time floor (agent/cadence.py) runs on the time of "on" steps only:
    # interleaved with two "off" blocks, wall time would count three times as often per "on"
    # step as a run with the agent always on does.
    on_time = [0.0]
    live._cadence.clock = lambda: on_time[0]
    x, y = torch.randn(args.batch, w), torch.randn(args.batch, 1)

    inside = [0.0, 0.0, 0.0]  # phase entry/exit, collective(), step_end()

    def mlp_step(tel: Any) -> None:
        t = time.perf_counter()
        fwd = tel.phase("forward")
        fwd.__enter__()
        inside[0] += time.perf_counter() - t
        try:
            loss = nn.functional.mse_loss(model(x), y)
        finally:
            t = time.perf_counter()
            fwd.__exit__(None, None, None)
            inside[0] += time.perf_counter() - t
        with tel.phase("backward"):
            loss.backward()
        handles = []
        for p in model.parameters():
            work = dist.all_reduce(p.grad, async_op=True)
            t = time.perf_counter()
            handles.append(
                tel.collective(work, op="all_reduce", nbytes=p.grad.numel() * 4, group_size=world)
            )
            inside[1] += time.perf_counter() - t
        for h in handles:
            h.wait()
        with tel.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        t = time.perf_counter()
        tel.step_end(
            memory=MemoryBytes(params=numel * 4, grads=numel * 4, optim=numel * 8),
            loss=loss.detach(),
            lr=1e-4,
        )
        inside[2] += time.perf_counter() - t

    if model is not None:
        step = mlp_step
    for _ in range(3):
        step(off)
        step(live)
    t0 = time.perf_counter()
    _skip_unreported(live)
    threads_per_step = _threads_per_step(step, live, agent_threads, max(50, args.blocks // 4))
    on_time[0] += time.perf_counter() - t0
    times: dict[str, list[float]] = {"on": [], "off": [], "off-again": []}
    cpu: dict[str, list[float]] = {"on": [], "off": [], "off-again": []}
    direct = [0.0, 0.0, 0.0]
    wire[0] = 0
    cost, own_before = live.cost, _counters(live.cost)
    agent_start = agent_threads.ns()
    for block in range(3 * args.blocks):
        mode = ORDERS[(block // 3) % 3][block % 3]
        tel = live if mode == "on" else off
        dist.barrier()
        if mode == "on":
            _skip_unreported(live)
        inside[:] = [0.0, 0.0, 0.0]
        a0 = agent_threads.ns()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            step(tel)
        times[mode].append((time.perf_counter() - t0) / args.steps)
        if mode == "on":
            on_time[0] += times[mode][-1] * args.steps
        # CPU time of the whole rank process (the training thread, gloo's workers) but the
        # agent's own threads, which are charged to the "on" steps below, whenever they ran:
        # robust to the machine being shared, unlike wall time.
        spent = time.process_time() - c0 - (agent_threads.ns() - a0) / 1e9
        cpu[mode].append(spent / args.steps)
        if mode == "on":
            direct = [a + b for a, b in zip(direct, inside)]
    n = args.blocks * args.steps
    _sent(live)
    # What the agent's threads did while interleaved (these steps' reports, but also
    # heartbeats and timer wake-ups for three times the wall time per "on" step): an upper
    # bound, printed beside the figure charged.
    interleaved = (agent_threads.ns() - agent_start) / 1e9 / n
    cpu["on"] = [c + threads_per_step for c in cpu["on"]]
    wire_per_step = wire[0] / n  # every message sent while measuring, heartbeats included
    own = [b - a for a, b in zip(own_before, _counters(cost), strict=True)]
    live.close()
    direct_per_step = [d / n for d in direct] if model is not None else None
    threads = (threads_per_step, interleaved, agent_threads.names)
    dropped = publisher.dropped
    out.put((rank, times, cpu, direct_per_step, own, live.errors, dropped, wire_per_step, threads))
    dist.destroy_process_group()


def _skip_unreported(live: Any) -> None:
    """The collectives since the last "on" step (the "off" steps', this bench's own barrier)
    were issued on the default group without the agent, which no real job does between two
    of its steps: the agent's watch of that group for collectives beside the reported ones
    (agent/script_collectives.py) starts again from the group's present sequence number, as if
    they were never issued (else every "on" step would find some, and read the recorder)."""
    watch = getattr(live, "_script", None)
    if watch is not None:
        watch.skip_issued()


ORDERS = (("on", "off", "off-again"), ("off", "off-again", "on"), ("off-again", "on", "off"))
"""Each round of three blocks runs the modes in a rotated order, so no mode always follows a
switch of telemetry (or always the same mode): the A/A control compares like with like."""


def _threads_per_step(step: Any, live: Any, threads: Any, steps: int) -> float:
    """CPU seconds per step of the agent's own threads as in a real run: over a stretch of
    consecutive "on" steps (interleaved with "off" steps they also pay their heartbeats and
    timer wake-ups for three times the wall time per step), until its reports are sent."""
    _sent(live)
    start = threads.ns()
    for _ in range(steps):
        step(live)
    _sent(live)
    return float((threads.ns() - start) / 1e9 / steps)


def _sent(live: Any, timeout: float = 5.0) -> None:
    """Wait until the agent's sender thread has sent what the measured steps handed it, so
    its CPU time for them is counted (it sends at most every 0.5 s when not woken)."""
    deadline = time.monotonic() + timeout
    while live._outbox.queued and time.monotonic() < deadline:
        time.sleep(0.02)


def _counters(cost: Any) -> tuple[int, int, int, int]:
    """(ns outside collectives, per-collective ns, collectives, steps) of the agent's own
    counters."""
    return cost.ns, cost.collective_ns, cost.collectives, cost.steps


def per_step_and_collective_us(own: list[int]) -> tuple[float | None, float | None]:
    """Training-thread us per step (outside the per-collective part) and per collective."""
    ns, collective_ns, collectives, steps = own
    return (
        ns / steps / 1e3 if steps else None,
        collective_ns / collectives / 1e3 if collectives else None,
    )


class _NoFuture:
    """A Work without ``get_future``: completion is then taken at the end of ``wait()``."""

    def __init__(self, work: Any) -> None:
        self.work = work

    def wait(self) -> Any:
        return self.work.wait()


def _ablate(live: Any, parts: str) -> None:
    """Switch parts of the live agent off, to see what the overhead is made of."""
    import contextlib

    for part in filter(None, parts.split(",")):
        if part == "hooks":
            live._activations.hooks = contextlib.nullcontext
        elif part == "send":
            live.publisher.send = lambda message: True
            live.publisher.send_batch = len
        elif part == "futures":
            track = live._collectives.track
            live._collectives.track = lambda work, *a, track=track: track(_NoFuture(work), *a)
        elif part == "sampler":
            live.sampler.stop()
        else:
            raise SystemExit(f"unknown --ablate part {part!r} (hooks, send, futures, sampler)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run both ranks; per rank: paired on/off ratios (CPU and wall), A/A control, agent-call
    time, wire bytes per step; plus the collector's counts."""
    from bench.harness import paired_ratio

    results, received = spawn_ranks(rank_main, args, timeout=1800)
    ranks = []
    for rank, times, cpu, direct, own, errors, dropped, wire, threads in results:
        step_us, collective_us = per_step_and_collective_us(own)
        ranks.append(
            {
                "rank": rank,
                "cpu_off_s": statistics.median(cpu["off"]),
                "cpu_on_off": paired_ratio(cpu["on"], cpu["off"]),
                "cpu_aa": paired_ratio(cpu["off-again"], cpu["off"]),
                "wall_off_s": statistics.median(times["off"]),
                "wall_on_off": paired_ratio(times["on"], times["off"]),
                "wall_aa": paired_ratio(times["off-again"], times["off"]),
                "agent_calls_s": None if direct is None else sum(direct),
                "direct": direct,
                "agent_us_per_step": step_us,
                "agent_us_per_collective": collective_us,
                "collectives_per_step": own[2] / own[3] if own[3] else None,
                "errors": errors,
                "dropped": dropped,
                "wire_bytes_per_step": wire,
                "agent_threads_us_per_step": threads[0] * 1e6,
                "agent_threads_interleaved_us_per_step": threads[1] * 1e6,
                "agent_threads": threads[2],
            }
        )
    return {"ranks": ranks, "collector": received}


def spawn_ranks(target: Any, args: Any, timeout: float) -> tuple[list[Any], dict[str, Any]]:
    """Run ``target(rank, 2, port, collector_address, args, queue)`` on 2 spawned ranks with a
    real collector; their results (sorted by rank) and the collector's counts. A rank that dies
    without a result fails the run at once instead of waiting out ``timeout``."""
    import multiprocessing as mp
    import queue
    import socket
    import time

    from zeroscope.collector.server import Collector

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    with Collector() as col:
        q = ctx.Queue()
        procs = [
            ctx.Process(target=target, args=(r, 2, port, col.ingest_address, args, q))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        results: list[Any] = []
        deadline = time.monotonic() + timeout
        try:
            while len(results) < len(procs):
                try:
                    results.append(q.get(timeout=5))
                except queue.Empty:
                    dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(
                            f"a rank failed (exit codes {dead}) or timed out"
                        ) from None
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
        received = col.stats()
    return sorted(results, key=lambda r: r[0]), received


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "demo", "zero3"), default="mlp")
    parser.add_argument("--layers", type=int, default=64, help="zero3: MLP depth")
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--ablate",
        default="",
        help="comma-separated agent parts to switch off: hooks, send, futures, sampler",
    )
    return parser


def _us(value: float | None) -> str:
    return "NA" if value is None else f"{value:.1f}"


def main() -> int:
    result = run(parser().parse_args())
    for r in result["ranks"]:
        print(
            f"rank {r['rank']}: CPU per step {r['cpu_off_s'] * 1e3:.2f} ms off: on/off "
            f"{r['cpu_on_off']:.4f} ({(r['cpu_on_off'] - 1) * 100:+.2f}%, goal <= +1%); "
            f"A/A control {r['cpu_aa']:.4f}"
        )
        print(
            f"rank {r['rank']}: agent's own counters: {_us(r['agent_us_per_step'])} us per step "
            f"(goal <= 30) + {_us(r['agent_us_per_collective'])} us per collective (goal <= 2), "
            f"{r['collectives_per_step'] or 0:.0f} collectives per step; its threads "
            f"({', '.join(r['agent_threads'])}) {r['agent_threads_us_per_step']:.0f} us CPU "
            f"per step ({r['agent_threads_interleaved_us_per_step']:.0f} interleaved)"
        )
        off, direct = r["wall_off_s"], r["direct"]
        if direct is None:
            continue
        print(
            f"rank {r['rank']}: step {off * 1e3:.2f} ms off: on/off {r['wall_on_off']:.4f} "
            f"({(r['wall_on_off'] - 1) * 100:+.2f}%, goal <= +1%); A/A control off-again/off "
            f"{r['wall_aa']:.4f}; agent calls {sum(direct) * 1e6:.0f} us/step "
            f"({sum(direct) / off * 100:.2f}% of the step: forward phase {direct[0] * 1e6:.0f}, "
            f"collective() {direct[1] * 1e6:.0f}, step_end {direct[2] * 1e6:.0f} us); "
            f"{r['wire_bytes_per_step']:.0f} B on the wire per step; errors {r['errors']}, "
            f"dropped {r['dropped']}"
        )
    received = result["collector"]
    print(f"collector: {received['accepted']} messages accepted, rejected {received['rejected']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
