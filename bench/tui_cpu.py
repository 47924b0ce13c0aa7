"""TUI bench: what the live view itself costs the machine, in CPU seconds per wall second.

    python bench/tui_cpu.py [--seconds 10] [--ranks 2,8,64,1024]

A monitoring view should cost what htop or nvitop cost: on a 2-core box every share of a core
the view takes is taken from training. The real app (zeroscope.tui.app.ZeroscopeApp, its feed
worker polling a QueueSource as under ``zeroscope run``, its 0.25 s redraw) runs on Textual's
headless driver at 160x48 while a producer thread hands it synthetic step reports
(tests.fixtures.synthetic_run: memory, phases, loss, collectives) at the job's pace. The
process's CPU time over the window, less the producer thread's own (time.thread_time in that
thread), is the view's; the headless driver does not write to a terminal, so a real terminal's
write cost is left out. The "idle" row (a view with nothing arriving) is the floor every other
row is read against. Goals: <= 5 % of a core at 8 ranks and 10 steps/s, <= 1 core at 1024 ranks.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures import RunShape, synthetic_run  # noqa: E402
from zeroscope.agent import schema  # noqa: E402

GOALS = {8: 0.05, 1024: 1.0}
"""Cores per wall second the view may use at these rank counts."""


def _steps(ranks: int, count: int) -> tuple[list[schema.Message], list[list[schema.Message]]]:
    run = synthetic_run(RunShape(ranks=ranks, steps=count, collectives=True, straggle_from=1))
    hellos = [m for m in run if isinstance(m, schema.Hello)]
    by_step: dict[int, list[schema.Message]] = {}
    for m in run:
        if not isinstance(m, schema.Hello):
            by_step.setdefault(m.step, []).append(m)
    return hellos, [by_step[s] for s in sorted(by_step)]


async def _measure(ranks: int, steps_per_s: float, seconds: float) -> dict[str, Any]:
    from zeroscope.run.launch import QueueSource
    from zeroscope.state import ClusterState
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.feed import LiveFeed

    count = max(1, round(steps_per_s * seconds))
    hellos, steps = _steps(ranks, count if steps_per_s else 1)
    source = QueueSource()
    app = ZeroscopeApp(ClusterState(), LiveFeed(source))
    producer_cpu = [0.0]

    def produce() -> None:
        start = time.thread_time()
        t0 = time.monotonic()
        for i, batch in enumerate(steps if steps_per_s else []):
            time.sleep(max(0.0, t0 + i / steps_per_s - time.monotonic()))
            for m in batch:
                source.put(m)
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        producer_cpu[0] = time.thread_time() - start

    async with app.run_test(size=(160, 48)) as pilot:
        for m in hellos:
            source.put(m)
        await pilot.pause(1.0)  # start-up layout is not the steady cost
        thread = threading.Thread(target=produce, daemon=True)
        c0, t0 = time.process_time(), time.monotonic()
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.1)
        c1, t1 = time.process_time(), time.monotonic()
    cores = (c1 - c0 - producer_cpu[0]) / (t1 - t0)
    return {"ranks": ranks, "steps_per_s": steps_per_s, "cores": cores, "wall_s": t1 - t0}


def measure(ranks: int, steps_per_s: float, seconds: float) -> dict[str, Any]:
    """One window: the view's CPU per wall second at ``ranks`` x ``steps_per_s``."""
    return asyncio.run(_measure(ranks, steps_per_s, seconds))


def rates(ranks_list: list[int]) -> list[tuple[int, float]]:
    """10 steps/s (a small model's pace) up to 64 ranks; 1024 ranks at 1 step/s, the pace of
    the large jobs that run on that many."""
    return [(r, 10.0 if r <= 64 else 1.0) for r in ranks_list]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--ranks", default="2,8,64,1024")
    args = parser.parse_args()
    idle = measure(2, 0.0, args.seconds)
    print(f"idle view: {idle['cores'] * 100:5.1f} % of a core")
    for ranks, pace in rates([int(r) for r in args.ranks.split(",")]):
        r = measure(ranks, pace, args.seconds)
        goal = GOALS.get(ranks)
        verdict = "" if goal is None else f" (goal <= {goal * 100:.0f} %)"
        print(f"{ranks:5d} ranks x {pace:g} steps/s: {r['cores'] * 100:5.1f} % of a core{verdict}")


if __name__ == "__main__":
    main()
