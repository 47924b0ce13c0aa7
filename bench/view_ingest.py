"""The view's ingest alone: one step of N synthetic reports folded into ClusterState, no TUI.

    python bench/view_ingest.py [--ranks 16384] [--steps 6]

bench/tui_frame.py times the same fold between its frames; this is the fold without Textual,
cheap enough to run before and after a change to zeroscope/state. Each step of the fixture run
(18 collectives and 2 transfers a report, one rank straggling) is folded with
``ClusterState.ingest_all`` after the Hellos and step 0; CPU is ``time.process_time()`` of this
process. It imports only what every tree has (ClusterState, the fixture), so one copy of it
times a tree before a change and after, side by side. The fixture run is gc-frozen
once built (``--no-freeze`` leaves it: every full collection then walks it, as bench/tui_frame.py
does).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures import RunShape, split_by_step, synthetic_run  # noqa: E402
from zeroscope.state import ClusterState  # noqa: E402


def bench(ranks: int, steps: int, freeze: bool = True) -> dict[str, float]:
    run = synthetic_run(RunShape(ranks=ranks, steps=steps + 1, collectives=True, straggle_from=1))
    if freeze:
        # The fixture's messages, all built up front, are the bench's, not the viewer's (a live
        # viewer holds a rank's newest report): frozen, the collector does not walk them.
        gc.freeze()
    hellos, by_step = split_by_step(run)
    state = ClusterState()
    state.ingest_all(hellos + by_step.pop(0))
    wall, cpu = [], []
    for step in sorted(by_step):
        t0, c0 = time.perf_counter(), time.process_time()
        closed = state.ingest_all(by_step[step])
        t1, c1 = time.perf_counter(), time.process_time()
        assert [a.step for a in closed] == [step]
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
    out = {
        "ingest_s": statistics.median(wall),
        "ingest_max_s": max(wall),
        "ingest_cpu_s": statistics.median(cpu),
        "per_report_us": statistics.median(cpu) / ranks * 1e6,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--no-freeze", action="store_true", help="leave the fixture run unfrozen")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    r = bench(args.ranks, args.steps, not args.no_freeze)
    print(
        f"ingest of one {args.ranks}-rank step: wall median {r['ingest_s'] * 1e3:.1f} ms "
        f"(max {r['ingest_max_s'] * 1e3:.1f}), CPU median {r['ingest_cpu_s'] * 1e3:.1f} ms = "
        f"{r['per_report_us']:.1f} us a report; load average {load:.1f} at the start"
    )


if __name__ == "__main__":
    main()
