"""TUI bench: what the live view itself costs the machine, in CPU seconds per wall second.

    python bench/tui_cpu.py [--seconds 20] [--warmup 13] [--ranks 2,8,64,1024] [--size 160x48]

A monitoring view should cost what htop or nvitop cost: on a 2-core box every share of a core
the view takes is taken from training. The real app (zeroscope.tui.app.ZeroscopeApp, its feed
worker polling a QueueSource as under ``zeroscope run``, its redraw timer) runs on Textual's
headless driver at 160x48 while a producer thread hands it synthetic step reports
(tests.fixtures.synthetic_run: memory, phases, loss, collectives) at the job's pace. The
process's CPU time over the window, less the producer thread's own (time.thread_time in that
thread), is the view's; the headless driver does not write to a terminal, so a real terminal's
write cost is left out.

The window starts after ``--warmup`` seconds of steps (WARMUP_S: one round of the live charts'
pace and 3 s more): a view that runs for hours costs its steady state, not the one-off layouts
of its first steps (the charts appearing as their data arrives, up to one chart interval later;
a window that held it read ~0.6 % of a core more). The fixture's own messages are moved out of the collector's sight (``gc.freeze``)
before the view starts: they are the bench's, and a real viewer process never holds them.

Each row is paired, in the same minutes, with ``zeroscope run --headless``'s work on the same
stream (the same QueueSource polled by a thread that folds every message into a ClusterState
and formats the step lines, zeroscope.state.lines, into a buffer): the state's fold is paid by
both, so the view's own repaint cost is the difference. The "idle" row (a view with nothing
arriving) is the floor every other row is read against. Goals: <= 5 % of a core at 8 ranks and
10 steps/s, <= 1 core at 1024 ranks.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures import RunShape, synthetic_run  # noqa: E402
from zeroscope.agent import schema  # noqa: E402
from zeroscope.tui.history_plots import LIVE_INTERVAL_S  # noqa: E402

GOALS = {8: 0.05, 1024: 1.0}
"""Cores per wall second the view may use at these rank counts."""
SIZE = (160, 48)
WARMUP_S = LIVE_INTERVAL_S + 3.0
"""Steps before the window: the charts have taken their first data and laid out by then."""


def _steps(ranks: int, count: int) -> tuple[list[schema.Message], list[list[schema.Message]]]:
    run = synthetic_run(RunShape(ranks=ranks, steps=count, collectives=True, straggle_from=1))
    hellos = [m for m in run if isinstance(m, schema.Hello)]
    by_step: dict[int, list[schema.Message]] = {}
    for m in run:
        if not isinstance(m, schema.Hello):
            by_step.setdefault(m.step, []).append(m)
    return hellos, [by_step[s] for s in sorted(by_step)]


class _Producer:
    """Hands each step's reports to ``put`` at ``steps_per_s`` from ``start`` for ``warmup +
    seconds``; records its own CPU at the window's start and end (its share is not the view's)."""

    def __init__(
        self,
        steps: list[list[schema.Message]],
        put: Callable[[schema.Message], None],
        steps_per_s: float,
        warmup: float,
        seconds: float,
    ) -> None:
        self.steps, self.put = steps, put
        self.steps_per_s, self.warmup, self.seconds = steps_per_s, warmup, seconds
        self.cpu_at_window = 0.0
        self.cpu_at_end = 0.0
        self.start = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True, name="bench-producer")

    def go(self) -> float:
        """Start; returns when the window opens (monotonic)."""
        self.start = time.monotonic()
        self.thread.start()
        return self.start + self.warmup

    def _run(self) -> None:
        window = self.start + self.warmup
        end = window + self.seconds
        marked = False
        for i, batch in enumerate(self.steps if self.steps_per_s else []):
            due = self.start + i / self.steps_per_s
            if due >= end:
                break
            if not marked and due >= window:
                time.sleep(max(0.0, window - time.monotonic()))
                self.cpu_at_window, marked = time.thread_time(), True
            time.sleep(max(0.0, due - time.monotonic()))
            for m in batch:
                self.put(m)
        if not marked:
            time.sleep(max(0.0, window - time.monotonic()))
            self.cpu_at_window = time.thread_time()
        time.sleep(max(0.0, end - time.monotonic()))
        self.cpu_at_end = time.thread_time()

    @property
    def window_cpu(self) -> float:
        return self.cpu_at_end - self.cpu_at_window


async def _until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.monotonic()))


async def _measure_view(
    hellos: list[schema.Message], producer_of: Callable[..., _Producer], size: tuple[int, int]
) -> tuple[float, float]:
    from zeroscope.run.launch import QueueSource
    from zeroscope.state import ClusterState
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.feed import LiveFeed

    source = QueueSource()
    app = ZeroscopeApp(ClusterState(), LiveFeed(source))
    producer = producer_of(source.put)
    async with app.run_test(size=size) as pilot:
        for m in hellos:
            source.put(m)
        await pilot.pause(1.0)  # start-up layout is not the steady cost
        window = producer.go()
        await _until(window)
        c0, t0 = time.process_time(), time.monotonic()
        await _until(window + producer.seconds)
        producer.thread.join()
        c1, t1 = time.process_time(), time.monotonic()
    return c1 - c0 - producer.window_cpu, t1 - t0


def _measure_headless(
    hellos: list[schema.Message], producer_of: Callable[..., _Producer]
) -> tuple[float, float]:
    """``zeroscope run --headless``'s loop (zeroscope.commands.run.run_headless) on the same
    stream, its lines written to a buffer."""
    from zeroscope.run.launch import QueueSource
    from zeroscope.state import ClusterState
    from zeroscope.state.lines import step_lines

    source = QueueSource()
    state = ClusterState()
    out = io.StringIO()
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            now = time.time()
            for m in source.poll(0.2):
                before = state.last_complete
                for line in step_lines(state, state.ingest(m, now), before):
                    out.write(line + "\n")

    for m in hellos:
        source.put(m)
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    time.sleep(1.0)
    producer = producer_of(source.put)
    window = producer.go()
    time.sleep(max(0.0, window - time.monotonic()))
    c0, t0 = time.process_time(), time.monotonic()
    producer.thread.join()
    c1, t1 = time.process_time(), time.monotonic()
    stop.set()
    consumer.join()
    return c1 - c0 - producer.window_cpu, t1 - t0


def measure(
    ranks: int,
    steps_per_s: float,
    seconds: float,
    *,
    warmup: float = WARMUP_S,
    size: tuple[int, int] = SIZE,
    headless: bool = True,
) -> dict[str, Any]:
    """One window: the view's CPU per wall second at ``ranks`` x ``steps_per_s``, and
    (``headless``) the headless loop's on the same stream just before it."""
    count = max(1, round(steps_per_s * (warmup + seconds)) + 1)
    hellos, steps = _steps(ranks, count if steps_per_s else 1)
    gc.collect()
    gc.freeze()  # the fixture is the bench's, not the viewer's: its collector never walks it

    def producer_of(put: Callable[[schema.Message], None]) -> _Producer:
        return _Producer(steps, put, steps_per_s, warmup, seconds)

    result: dict[str, Any] = {"ranks": ranks, "steps_per_s": steps_per_s, "headless": None}
    try:
        if headless:
            cpu, wall = _measure_headless(hellos, producer_of)
            result["headless"] = cpu / wall
        cpu, wall = asyncio.run(_measure_view(hellos, producer_of, size))
    finally:
        gc.unfreeze()
    result.update(cores=cpu / wall, wall_s=wall)
    return result


def rates(ranks_list: list[int]) -> list[tuple[int, float]]:
    """10 steps/s (a small model's pace) up to 64 ranks; 1024 ranks at 1 step/s, the pace of
    the large jobs that run on that many."""
    return [(r, 10.0 if r <= 64 else 1.0) for r in ranks_list]


def verdict(ranks: int, cores: float) -> str:
    goal = GOALS.get(ranks)
    if goal is None:
        return ""
    return f"<= {goal * 100:.0f} %: " + ("met" if cores <= goal else "MISSED")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=WARMUP_S)
    parser.add_argument("--ranks", default="2,8,64,1024")
    parser.add_argument("--size", default="160x48")
    args = parser.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    idle = measure(2, 0.0, args.seconds, warmup=0.0, size=(w, h), headless=False)
    print(f"{'':26s}  view  headless   (% of a core, {w}x{h}, {args.seconds:g} s windows)")
    print(f"{'idle view':26s} {idle['cores'] * 100:5.1f}")
    for ranks, pace in rates([int(r) for r in args.ranks.split(",")]):
        r = measure(ranks, pace, args.seconds, warmup=args.warmup, size=(w, h))
        label = f"{ranks} ranks x {pace:g} steps/s"
        print(
            f"{label:26s} {r['cores'] * 100:5.1f} {r['headless'] * 100:8.1f}   "
            f"{verdict(ranks, r['cores'])}",
            flush=True,
        )


if __name__ == "__main__":
    main()
