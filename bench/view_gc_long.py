"""Does freezing the viewer's heap after each closed step leak, with Textual in the process?

    python bench/view_gc_long.py [--ranks 256] [--steps 1200] [--gc none|freeze-steps]

``gc.freeze()`` takes every object then alive out of the cyclic collector's sight for good:
one that later becomes part of a garbage *cycle* is never freed. ClusterState holds no cycle
(tests/test_gc_catch_up.py), but the TUI's process also holds Textual's widgets, messages and
caches, which do. This folds ``--steps`` steps of one step's reports renumbered as they go
(past the state's 512-step history caps) into the cluster screen of a headless ZeroscopeApp,
draws a frame after each step as the live view does, and with ``--gc freeze-steps`` freezes
after each step (``young-freeze-steps``: after a collection of the young generations, so that
their dead cycles are not frozen with the rest); ``thresholds`` raises the collector's
thresholds instead (``gc.set_threshold(50_000, 20, 100)``: nothing frozen, collections rarer).
It prints the RSS and frozen objects at a quarter, half and all of the steps: bounded, they
level off once the history caps are reached; leaking, they keep growing. The marks read RSS as
it is (``--collect-at-marks``: after a full collection, what the collector cannot free, as the
first rows in docs/bench.md were taken); the peak is the largest RSS sampled after every step
and the kernel's high-water mark (VmHWM, reset once the app is up, where /proc allows), so the
garbage a policy postpones between whole-heap collections shows. Per step it also times the
ingest and frame's CPU (median and max) and the longest time in collections.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402

from bench.view_ingest import _GcTime, _reset_hwm, _rss_mb  # noqa: E402
from tests.fixtures import RunShape, split_by_step, synthetic_run  # noqa: E402
from zeroscope.state import ClusterState  # noqa: E402

POLICIES = ("none", "freeze-steps", "young-freeze-steps", "thresholds")


async def run(ranks: int, steps: int, policy: str, collect_at_marks: bool) -> dict[str, Any]:
    from zeroscope.tui.app import ZeroscopeApp

    if policy == "thresholds":
        gc.set_threshold(50_000, 20, 100)

    run = synthetic_run(RunShape(ranks=ranks, steps=2, collectives=True))
    hellos, by_step = split_by_step(run)
    template = by_step[1]
    state = ClusterState()
    state.ingest_all(hellos + by_step[0])
    gc.collect()
    gc.freeze()  # the template and the start-up: the bench's, not the steady state's
    marks: dict[int, tuple[float, int, int]] = {}
    full0, c0 = gc.get_stats()[2]["collections"], time.process_time()
    clock = _GcTime()
    app = ZeroscopeApp(state)
    step_cpu: list[float] = []
    step_gc: list[float] = []
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot._wait_for_screen()
        rss0, hwm_reset = _rss_mb(), _reset_hwm()
        peak = rss0
        for step in range(1, steps + 1):
            shift = (step - 1) * 10**9
            s0, g0 = time.process_time(), clock.s
            app.state.ingest_all(
                [msgspec.structs.replace(m, step=step, wall_ns=m.wall_ns + shift) for m in template]
            )
            app.redraw()
            await pilot.pause()
            if policy == "young-freeze-steps":
                gc.collect(1)  # the young generations' dead cycles, not to be frozen with the rest
            if policy.endswith("freeze-steps"):
                gc.freeze()
            step_cpu.append(time.process_time() - s0)
            step_gc.append(clock.s - g0)
            peak = max(peak, _rss_mb())
            if step in (steps // 4, steps // 2, steps):
                if collect_at_marks:
                    gc.collect()  # what the collector can still free: left is live, or leaked
                marks[step] = (_rss_mb(), gc.get_freeze_count(), len(gc.get_objects()))
    return {
        "marks": marks,
        "rss0": rss0,
        "peak": peak,
        "hwm": _rss_mb("VmHWM") if hwm_reset else float("nan"),
        "step_cpu": step_cpu,
        "step_gc": step_gc,
        "full": gc.get_stats()[2]["collections"] - full0,
        "cpu_s": time.process_time() - c0,
        "gc_s": clock.s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--gc", choices=POLICIES, default="none")
    p.add_argument(
        "--collect-at-marks",
        action="store_true",
        help="run a full collection before each mark's reading (hides the postponed garbage)",
    )
    args = p.parse_args()
    load = os.getloadavg()[0]
    r = asyncio.run(run(args.ranks, args.steps, args.gc, args.collect_at_marks))
    cpu, gcs = r["step_cpu"], r["step_gc"]
    marks = "; ".join(
        f"step {s}: RSS {rss:.0f} MB, {frozen} frozen, {live} in the generations"
        for s, (rss, frozen, live) in r["marks"].items()
    )
    print(
        f"{args.steps} steps of {args.ranks} ranks with a frame each, gc {args.gc}: {marks}; "
        f"{r['full']} whole-heap collections, CPU {r['cpu_s']:.1f} s ({r['gc_s']:.1f} s in "
        f"collections, the marks' own included); RSS {r['rss0']:.0f} MB with the app up, peak "
        f"sampled after each step {r['peak']:.0f} MB, VmHWM {r['hwm']:.0f} MB; a step's CPU "
        f"median {statistics.median(cpu) * 1e3:.1f} ms, max {max(cpu) * 1e3:.1f} ms; a step's "
        f"time in collections max {max(gcs) * 1e3:.1f} ms; "
        f"collect at marks {args.collect_at_marks}; load {load:.1f} at the start"
    )


if __name__ == "__main__":
    main()
