"""TUI bench: the cluster screen's frame time at 1024 ranks, and replay seek time in a trace of
10^6 step reports.

    python bench/tui_frame.py [--ranks 1024] [--reports 1000000] [--frames 20]

Frame: one step of 1024 reports is folded into ClusterState (timed apart: "ingest"), then the
cluster screen rebuilds its rows (sort, alerts) and Textual lays out and paints the frame on
its headless driver ("frame"), at 80x24 (heatmap) and 160x48. Goal: frame <= 50 ms.

Seek: ``ReplayFeed.goto(step)`` then the poll that answers it: the Hellos plus a short window of
steps read through the trace's (step, rank, kind) index and decoded ("seek"), then folded into
a fresh ClusterState ("rebuild"). Goal: seek <= 100 ms. The trace (1024 ranks x ~977 steps of
reports with memory, phases and loss, no collective lists) is built once and cached.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures import RunShape, synthetic_run  # noqa: E402
from zeroscope.agent import schema  # noqa: E402
from zeroscope.state import ClusterState  # noqa: E402


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:6.1f} ms, max {max(values) * 1e3:6.1f} ms"


async def _frames(
    ranks: int, frames: int, size: tuple[int, int]
) -> tuple[list[float], list[float], list[float]]:
    from zeroscope.tui.app import ZeroscopeApp

    run = synthetic_run(RunShape(ranks=ranks, steps=frames + 2, collectives=True, straggle_from=1))
    hellos = [m for m in run if isinstance(m, schema.Hello)]
    by_step: dict[int, list[schema.Message]] = {}
    for m in run:
        if not isinstance(m, schema.Hello):
            by_step.setdefault(m.step, []).append(m)
    state = ClusterState()
    state.ingest_all(hellos + by_step.pop(0))
    app = ZeroscopeApp(state)
    ingest, frame, cpu = [], [], []
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for step in sorted(by_step):
            t0 = time.perf_counter()
            state.ingest_all(by_step[step])
            t1, c1 = time.perf_counter(), time.process_time()
            app.redraw()
            # What Pilot.pause() does minus its wait for an idle CPU (which would time the
            # machine's other load): let every widget handle its refresh, then lay out and
            # paint the frame (Screen._on_timer_update is the compositor's frame tick).
            await pilot._wait_for_screen()
            app.screen._on_timer_update()
            t2, c2 = time.perf_counter(), time.process_time()
            ingest.append(t1 - t0)
            frame.append(t2 - t1)
            cpu.append(c2 - c1)
    return ingest, frame, cpu


def bench_frames(ranks: int, frames: int) -> None:
    for size in ((80, 24), (160, 48)):
        ingest, frame, cpu = asyncio.run(_frames(ranks, frames, size))
        print(
            f"cluster screen {size[0]}x{size[1]}, {ranks} ranks: frame {_ms(frame)} "
            f"(CPU {_ms(cpu)}); ingest of one step {_ms(ingest)}"
        )


def build_trace(path: Path, ranks: int, reports: int) -> None:
    from zeroscope.trace import TraceWriter

    steps = reports // ranks
    shape = RunShape(ranks=ranks, steps=1, collectives=False)
    hellos = [m for m in synthetic_run(shape) if isinstance(m, schema.Hello)]
    template = next(m for m in synthetic_run(shape) if isinstance(m, schema.StepReport))
    writer = TraceWriter(path, job_id=hellos[0].job_id, commit_rows=50_000, commit_interval=60)
    for h in hellos:
        writer.append(h, schema.encode(h))
    for step in range(steps):
        for rank in range(ranks):
            m = schema.StepReport(
                rank=rank,
                step=step,
                wall_ns=template.wall_ns + step * 150_000_000,
                duration_s=template.duration_s * (1.3 if rank == 7 else 1.0),
                phases=template.phases,
                memory=template.memory,
                loss=3.0 - step * 1e-3,
                loss_scale=65536.0,
                samples=4,
            )
            writer.append(m, schema.encode(m))
    writer.close()


def bench_seek(ranks: int, reports: int, seeks: int) -> None:
    from zeroscope.trace import TraceReader
    from zeroscope.tui.feed import ReplayFeed

    path = Path(tempfile.gettempdir()) / f"zeroscope-bench-{ranks}x{reports}.zstrace"
    if not path.exists():
        t0 = time.perf_counter()
        build_trace(path.with_suffix(".tmp"), ranks, reports)
        path.with_suffix(".tmp").rename(path)
        print(
            f"built {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s"
        )
    reader = TraceReader(path)
    feed = ReplayFeed(reader, paused=True)
    feed.poll(0)  # the initial seek to the first step
    first, last = feed.first, feed.last
    targets = [first + (last - first) * i // (seeks - 1) for i in range(seeks)]
    targets = targets[::2] + targets[1::2]  # jump back and forth, not only forward
    seek, rebuild, seek_cpu = [], [], []
    for target in targets:
        t0, c0 = time.perf_counter(), time.process_time()
        feed.goto(target)
        batch = feed.poll(0)
        t1, c1 = time.perf_counter(), time.process_time()
        state = ClusterState()
        state.ingest_all(batch.messages if batch else [])
        state.flush()
        t2 = time.perf_counter()
        assert batch is not None and state.latest() is not None
        assert state.latest().step == target  # type: ignore[union-attr]
        seek.append(t1 - t0)
        seek_cpu.append(c1 - c0)
        rebuild.append(t2 - t1)
    print(
        f"seek in {reader.count('step')} step reports ({ranks} ranks, window "
        f"{feed.window} steps): seek {_ms(seek)} (CPU {_ms(seek_cpu)}); state rebuild {_ms(rebuild)}"
    )
    reader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--seeks", type=int, default=20)
    args = parser.parse_args()
    bench_frames(args.ranks, args.frames)
    bench_seek(args.ranks, args.reports, args.seeks)


if __name__ == "__main__":
    main()
