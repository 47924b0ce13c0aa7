"""Agent overhead: step time with the live agent on vs off, 2 gloo ranks, one run.

Goal: <= 1% slower with the agent on. Both modes run in the same processes, alternating in
blocks of steps (on, off, on, off, ...), so machine noise hits both alike; the figure is the
ratio of median block times. The "on" mode does everything the live agent does in a real run:
phases with saved-tensor hooks in forward, every all-reduce through ``tel.collective``, a
StepReport per step published to a real collector, the sampler thread with heartbeats.

Usage: ``python bench/agent_overhead.py [--blocks 10] [--steps 10] [--width 1024]``
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

    from zeroscope.agent.api import NullTelemetry
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.publish import Publisher
    from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    w = args.width
    model = nn.Sequential(
        nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w), nn.GELU(), nn.Linear(w, 1)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    numel = sum(p.numel() for p in model.parameters())
    publisher = Publisher(address)
    publisher.wait_connected(5.0)
    live = LiveTelemetry(publisher, rank=rank, world_size=world, job_id="bench")
    live.hello(
        config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
        params=ParamCounts(total=numel, trainable=numel),
    )
    off = NullTelemetry()
    x, y = torch.randn(args.batch, w), torch.randn(args.batch, 1)

    def step(tel: Any) -> None:
        with tel.phase("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with tel.phase("backward"):
            loss.backward()
        handles = [
            tel.collective(
                dist.all_reduce(p.grad, async_op=True),
                op="all_reduce",
                nbytes=p.grad.numel() * 4,
                group_size=world,
            )
            for p in model.parameters()
        ]
        for h in handles:
            h.wait()
        with tel.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        tel.step_end(
            memory=MemoryBytes(params=numel * 4, grads=numel * 4, optim=numel * 8),
            loss=loss.detach(),
            lr=1e-4,
        )

    for _ in range(3):
        step(off)
        step(live)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for block in range(2 * args.blocks):
        mode = "on" if block % 2 == 0 else "off"
        tel = live if mode == "on" else off
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(tel)
        times[mode].append((time.perf_counter() - t0) / args.steps)
    live.close()
    out.put((rank, times, live.errors, publisher.dropped))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    import multiprocessing as mp
    import socket

    from zeroscope.collector import Collector

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    with Collector() as col:
        q = ctx.Queue()
        procs = [
            ctx.Process(target=rank_main, args=(r, 2, port, col.ingest_address, args, q))
            for r in range(2)
        ]
        for p in procs:
            p.start()
        results = sorted(q.get(timeout=1800) for _ in procs)
        for p in procs:
            p.join()
        received = col.stats()
    for rank, times, errors, dropped in results:
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        print(
            f"rank {rank}: step {off * 1e3:.2f} ms off, {on * 1e3:.2f} ms on, "
            f"ratio {on / off:.4f} ({(on / off - 1) * 100:+.2f}%), goal <= +1%; "
            f"agent errors {errors}, dropped {dropped}"
        )
    print(f"collector: {received['accepted']} messages accepted, rejected {received['rejected']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
