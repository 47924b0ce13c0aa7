"""The FLOP count's cost: the agent's work meter with the count on against the same meter with
it off (``ZEROSCOPE_FLOPS=0``), on the steps after the counted one, in one process.

The count runs once per new input shape (at most 4 per model), under a dispatch mode that
puts every op of that one step through Python; after it, the meter with the count on does per
forward what the one with it off does (the tokens) plus a dictionary look-up of the shapes'
count. The goal: the training steps' process CPU time with the count on within 1.01 of it off,
printed beside an A/A control (a second meter with the count off against the first: this
machine's noise floor). The one-time cost of the counted step is printed beside it (its CPU
time over an uncounted step's).

Modes run interleaved in rounds (one block of steps per mode, the order rotated every round),
so drift hits all alike; the figure is the median over rounds. Each step is a real training
step of a small GPT (tests/throughput_support.py's KnownGPT) with AdamW, on one thread; the
meter's per-step path is the agent's: ``inputs`` at the forward, ``take`` at the step's end,
``work_report`` (the sender thread's part) after it.

Usage: ``python bench/flop_count_overhead.py [--rounds 200] [--steps 4]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=200, help="rounds of one block per mode")
    p.add_argument("--steps", type=int, default=4, help="training steps per block")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from tests.throughput_support import KnownGPT
    from zeroscope.agent.work import WorkMeter, work_report

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = KnownGPT(vocab=64, dim=args.dim, heads=4, layers=2, seq=args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, 64, (args.batch, args.seq + 1))
    idx, targets = data[:, :-1], data[:, 1:]

    def step(meter: WorkMeter | None, n: int) -> None:
        if meter is not None:
            meter.inputs(model, (idx, targets), {}, n)
        loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if meter is not None:
            facts = meter.take(n)
            if facts is not None:
                work_report(facts)

    def meter(count: bool) -> WorkMeter:
        m = WorkMeter()
        m.enabled = count
        return m

    on, off, control = meter(True), meter(False), meter(False)
    # The counted step, timed once (its one-time cost), against an uncounted one.
    step(off, 0)
    t0 = time.process_time()
    step(off, 1)
    plain = time.process_time() - t0
    t0 = time.process_time()
    step(on, 1)
    counted = time.process_time() - t0
    flops = on._counted and next(iter(on._counted.values()))[0]
    deadline = time.monotonic() + 5.0  # the peak probe's 0.25 s off the measured blocks
    while on.peak.figure()[0] is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for m in (on, off, control):
        step(m, 2)

    modes = {"on": on, "off": off, "control": control}
    names = list(modes)
    cpu: dict[str, list[float]] = {n: [] for n in names}
    n = 3
    for r in range(args.rounds):
        order = names[r % 3 :] + names[: r % 3]
        for name in order:
            t0 = time.process_time()
            for _ in range(args.steps):
                step(modes[name], n)
                n += 1
            cpu[name].append(time.process_time() - t0)
    on_off = statistics.median(a / b for a, b in zip(cpu["on"], cpu["off"], strict=True))
    aa = statistics.median(a / b for a, b in zip(cpu["control"], cpu["off"], strict=True))
    return {
        "cpu_ms_per_step_off": 1e3 * statistics.median(cpu["off"]) / args.steps,
        "cpu_on_off": on_off,
        "cpu_aa_control": aa,
        "counted_step_ratio": counted / plain if plain > 0 else None,
        "counts": len(on._counted),
        "flops_per_step": flops or None,
        "meter_errors": on.errors + off.errors + control.errors,
    }


def main() -> None:
    result = run(parser().parse_args())
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
