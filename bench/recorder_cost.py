"""What torch's Flight Recorder costs a collective, and what zeroscope's ring size changes of it.

torch 2.13 records every collective by default (``TORCH_FR_BUFFER_SIZE`` unset: a ring of 2,000
entries, checked here in every process); ``zeroscope run`` sets the ring to 128 entries unless
the job set it (agent/attach/flight_recorder.py: a dump walks the whole ring, ~1 ms at 128
against ~20 ms at 2,000). bench/attach_overhead.py cannot see the recording: the ring is set
before the job's groups exist, process wide, and cannot be switched, so its on and off modes
both record. So this bench compares processes, one per mode: torch's default ring, zeroscope's
(128), and no ring (``0``), each creating a gloo group of one (torch records it as it records
every group) and timing blocks of small all-reduces on the calling thread's and the process's
CPU clocks. Per entry torch gathers the calling thread's Python stack (``CapturedTraceback``;
torch 2.13 has no setting to skip it), so the cost is measured at a shallow and a deep stack.
Every mode sets one variable of the same length (an unread one stands in for torch's): the
environment's size moves the stack's alignment, which alone moved a process's figure by a few
percent.

A round runs four processes (torch's default, 128, none, torch's default again), in an order
rotated every round (drift hits all alike); the figures are medians over rounds of each round's
own difference from torch's default (microseconds a collective) and ratio, with a 90 %
bootstrap interval (bench/goal.py); the second default against the first is the A/A control.

Usage: ``python bench/recorder_cost.py [--rounds 8] [--ops 4000] [--blocks 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEPTHS = (8, 64)
"""Python frames under the collective's call: a plain loop's, and a deep stack's (an HF Trainer
step inside accelerate, DeepSpeed and hooks runs ~40-60 frames deep)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8, help="rounds of one process per mode")
    p.add_argument("--ops", type=int, default=4000, help="all-reduces per block")
    p.add_argument("--blocks", type=int, default=5, help="blocks per stack depth per process")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def child(args: argparse.Namespace) -> dict[str, float]:
    """One process's median CPU per all-reduce (microseconds) at each stack depth: the calling
    thread's, and the whole process's (gloo's worker threads run the collective)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    tensor = torch.ones(256)

    def block(depth: int) -> tuple[float, float]:
        if depth > 1:
            return block(depth - 1)
        t0, p0 = time.thread_time_ns(), time.process_time_ns()
        for _ in range(args.ops):
            dist.all_reduce(tensor)
        t1, p1 = time.thread_time_ns(), time.process_time_ns()
        return (t1 - t0) / args.ops / 1e3, (p1 - p0) / args.ops / 1e3

    for depth in DEPTHS:
        block(depth)  # warm
    thread: dict[int, list[float]] = {d: [] for d in DEPTHS}
    process: dict[int, list[float]] = {d: [] for d in DEPTHS}
    for _ in range(args.blocks):
        for depth in DEPTHS:
            on_thread, in_process = block(depth)
            thread[depth].append(on_thread)
            process[depth].append(in_process)
    from zeroscope.agent.attach.fr_entries import dump_all

    try:
        recorded = sum(len(entries) for entries in dump_all())
    except Exception:  # no ring (``0``): torch's dump has no entries to decode
        recorded = 0
    dist.destroy_process_group()
    figures = {"recorded": float(recorded)}
    figures |= {f"thread {d}": statistics.median(v) for d, v in thread.items()}
    return figures | {f"process {d}": statistics.median(v) for d, v in process.items()}


MODES = {"torch's default": None, "zeroscope's 128": "128", "none": "000"}
"""Each mode's ``TORCH_FR_BUFFER_SIZE`` (None: unset, an unread variable of the same length in
its place)."""
BASE = "torch's default"


def one_process(args: argparse.Namespace, ring: str | None) -> tuple[float, dict[str, float]]:
    """(the entries torch kept, the process's figures) with the ring ``ring`` asks for."""
    from zeroscope.agent.attach.flight_recorder import BUFFER_ENV, LEGACY_BUFFER_ENV

    env = {k: v for k, v in os.environ.items() if k not in (BUFFER_ENV, LEGACY_BUFFER_ENV)}
    env["OMP_NUM_THREADS"] = "1"
    env[BUFFER_ENV if ring is not None else BUFFER_ENV.replace("FR_", "ZS_")] = ring or "128"
    argv = [sys.executable, __file__, "--child", "--ops", str(args.ops)]
    argv += ["--blocks", str(args.blocks)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600)
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    recorded = figures.pop("recorded")
    if ring is not None and recorded != int(ring):
        # not the ring asked for: the modes would not compare what they say
        raise RuntimeError(f"TORCH_FR_BUFFER_SIZE={ring}: torch kept {recorded:.0f} entries")
    return recorded, figures


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every round's processes; per clock and depth each mode's figure, its difference from
    torch's default and its ratio, each with its interval, and the A/A control."""
    from bench.goal import median_interval
    from bench.harness import rotated

    order = [*MODES, "torch's default again"]
    rounds: list[dict[str, dict[str, float]]] = []
    rings: dict[str, float] = {}
    for r in range(args.rounds):
        got: dict[str, dict[str, float]] = {}
        for mode in rotated(order, r):
            kept, got[mode] = one_process(args, MODES.get(mode))
            rings.setdefault(mode, kept)
        rounds.append(got)
    kept_by_mode = {mode: rings[mode] for mode in MODES}
    result: dict[str, Any] = {"rounds": args.rounds, "ops": args.ops, "rings": kept_by_mode}
    figures: dict[str, Any] = {}
    for key in rounds[0][BASE]:
        base = [r[BASE][key] for r in rounds]
        again = [r["torch's default again"][key] for r in rounds]
        row: dict[str, Any] = {
            "base_us": statistics.median(base),
            "aa": statistics.median(b / a for a, b in zip(base, again, strict=True)),
        }
        for mode in MODES:
            if mode == BASE:
                continue
            values = [r[mode][key] for r in rounds]
            extra = [b - a for a, b in zip(base, values, strict=True)]
            ratio = [b / a for a, b in zip(base, values, strict=True)]
            row[mode] = {
                "us": statistics.median(values),
                "extra_us": statistics.median(extra),
                "extra_interval": median_interval(extra),
                "ratio": statistics.median(ratio),
            }
        figures[key] = row
    result["figures"] = figures
    return result


def main() -> None:
    args = parser().parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    from bench.harness import load_average

    print(f"load average {load_average()} at the start; {args.rounds} rounds x 4 processes")
    result = run(args)
    print("entries torch kept: " + ", ".join(f"{m} {n:.0f}" for m, n in result["rings"].items()))
    for key, row in result["figures"].items():
        clock, depth = key.split()
        said = [f"{clock} CPU, stack of {depth} frames: torch's default {row['base_us']:.2f} us"]
        for mode in MODES:
            if mode != BASE:
                d = row[mode]
                lo, hi = d["extra_interval"] or (float("nan"), float("nan"))
                said.append(
                    f"{mode} {d['extra_us']:+.2f} us (90% {lo:+.2f} to {hi:+.2f}, "
                    f"x{d['ratio']:.3f})"
                )
        print("; ".join(said) + f"; A/A {row['aa']:.3f}")


if __name__ == "__main__":
    main()
