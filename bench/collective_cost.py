"""What one collective costs the training thread in place, by an independent clock.

The agent's own counters (agent/cost.py) time its code with clock reads inside it: they miss
the call into it, its frames' setup and the caches its Python evicts between the engine's
kernels, so they say ~2 us per collective where the step loses several times that
(docs/bench.md, against the agent's overhead budget). Here the training thread's CPU clock (``time.thread_time_ns``)
measures the whole difference, the way a ZeRO-3 step issues its gathers: a real gloo
all-reduce issued asynchronously (world 1: the collective's own cost without a peer), one
layer's compute while it is in flight, then its ``wait()``; blocks of 100 ops per variant,
rounds with the variants' order rotated, medians per op over the "off" blocks:

- ``off``: the no-op telemetry (what the engine pays without the agent); ``off-again``: the
  same, the A/A control;
- ``agent``: the live agent's ``collective()`` and its handle's ``wait()`` (step ends and the
  sender's work are outside the timed blocks: this is the per-op part only);
- ``agent, raw wait``: the live agent's ``collective()``, then the Work's own ``wait()``: the
  record alone, without the handle that times the wait;
- ``agent, Python seam``: the live agent with the Python twin of its C seam
  (agent/host_seam.py; the C seam is agent/_seam.c, used by ``agent`` where it was built);
- ``3 clock reads``: the reads the op's timing needs (issue, wait entry, wait exit), a floor for
  any Python implementation.

Usage: ``python bench/collective_cost.py [--rounds 150] [--width 128]``
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

OPS = 100
"""Collectives per timed block."""

VARIANTS = ("off", "off-again", "agent", "agent, raw wait", "agent, Python seam", "3 clock reads")


def measure(rounds: int, width: int) -> dict[str, float]:
    """Microseconds of training-thread CPU per collective over ``off``, per variant."""
    import torch
    import torch.distributed as dist

    from zeroscope.agent import host_seam
    from zeroscope.agent.api import NullTelemetry
    from zeroscope.agent.cost import now_ns
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.publish import Publisher
    from zeroscope.agent.schema import MemoryBytes

    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    with socket.socket() as s:  # nothing listens there: reports are held, then dropped
        s.bind(("127.0.0.1", 0))
        nowhere = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    live = LiveTelemetry(Publisher(nowhere), sample_interval=3600.0)
    native, host_seam.NATIVE = host_seam.NATIVE, None
    try:
        python = LiveTelemetry(Publisher(nowhere), sample_interval=3600.0)
    finally:
        host_seam.NATIVE = native
    for agent in (live, python):
        agent.sampler.stop()
    off = NullTelemetry()
    x, w = torch.randn(64, width), torch.randn(width, width)
    buf = torch.randn(width * width)

    def block(variant: str) -> int:
        tel = python if variant == "agent, Python seam" else live if "agent" in variant else off
        raw = variant == "agent, raw wait"
        clocks = variant == "3 clock reads"
        t0 = time.thread_time_ns()
        for _ in range(OPS):
            work = dist.all_reduce(buf, async_op=True)
            if clocks:
                now_ns()
            handle = tel.collective(
                work, op="all_gather", nbytes=4 * buf.numel(), group_size=2, label="layers.3.fc"
            )
            torch.nn.functional.gelu(x @ w)
            if clocks:
                now_ns()
            work.wait() if raw else handle.wait()
            if clocks:
                now_ns()
        spent = time.thread_time_ns() - t0
        if tel is not off:  # the step's end and the sender's work: not per-op costs, untimed
            tel.step_end(memory=MemoryBytes())
            tel.drain()
        return spent

    per_op: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for variant in order:
            per_op[variant].append(block(variant) / OPS)
    live.close()
    python.close()
    dist.destroy_process_group()
    base = statistics.median(per_op["off"])
    return {v: (statistics.median(per_op[v]) - base) / 1e3 for v in VARIANTS} | {
        "off us per op": base / 1e3,
        "agent counters us per collective": live.cost.per_collective_us() or 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--width", type=int, default=128)
    args = parser.parse_args(argv)
    for name, us in measure(args.rounds, args.width).items():
        print(f"{name:>34}: {us:+.2f} us")


if __name__ == "__main__":
    main()
