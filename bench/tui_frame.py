"""TUI bench: the cluster screen's frame time at 1024 ranks, and replay seek time in a trace of
10^6 step reports.

    python bench/tui_frame.py [--ranks 1024] [--reports 1000000] [--frames 20]

Frame: one step of 1024 reports is folded into ClusterState (timed apart: "ingest"), then the
cluster screen rebuilds its rows (sort, alerts) and Textual lays out and paints the frame on
its headless driver ("frame"), at 80x24 (heatmap) and 160x48. Goal: frame <= 50 ms. The
history plots are measured four ways in the same run: as a live job draws them (new data at
most once a second, handed to one chart per frame: "plots live"), the live pace without the
second's rest (one chart rebuilt in every frame, the most a live frame pays: "plots one chart
every frame"), every chart rebuilt in every frame (replay's pace when each frame moves the
cursor: "plots every frame"), and hidden ("plots off", the baseline the plots' cost is read
against; unchanged by how charts are paced, so it also shows the run's noise).

Seek: ``ReplayFeed.goto(step)`` then the poll that answers it: the Hellos plus a short window of
steps read through the trace's (step, rank, kind) index and decoded ("seek"), then folded into
a fresh ClusterState ("rebuild"). Goal: seek <= 100 ms. The trace (1024 ranks x ~977 steps of
reports with memory, phases and loss, no collective lists) is built once and cached.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sqlite3
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fixtures import RunShape, split_by_step, synthetic_run  # noqa: E402
from zeroscope.agent import schema  # noqa: E402
from zeroscope.state import ClusterState  # noqa: E402

CACHE = ROOT / ".bench-cache"
"""Built traces are kept here between runs (gitignored)."""


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1e3:6.1f} ms, max {max(values) * 1e3:6.1f} ms"


ingest_cpu: list[float] = []
"""CPU time of every step's ingest of the last _frames run (the wall time is in its result)."""

UPDATES: list[float] = []
"""Duration of every screen update of the last _frames run (Screen._on_timer_update)."""

VIEW = ["table"]
"""What the cluster screen's ranks' slot showed in the last _frames run: table, heatmap, nodes."""

PLOT_MODES = ("live", "one chart every frame", "every frame", "off")
MIN_INTERVAL_S = {"live": 1.0, "one chart every frame": 1e-9, "every frame": 0.0, "off": 0.0}
"""HistoryPlots.min_interval_s per mode: any positive value paces the charts one per frame."""


@functools.cache
def _run(ranks: int, steps: int) -> list[schema.Message]:
    """The fixture run, built once per process (16,384 ranks take a minute to build)."""
    return synthetic_run(RunShape(ranks=ranks, steps=steps, collectives=True, straggle_from=1))


async def _frames(
    ranks: int, frames: int, size: tuple[int, int], plots: str = "live"
) -> tuple[list[float], list[float], list[float], list[int]]:
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.history_plot import HistoryPlot
    from zeroscope.tui.history_plots import HistoryPlots

    run = _run(ranks, frames + 2)
    UPDATES.clear()
    hellos, by_step = split_by_step(run)
    state = ClusterState()
    state.ingest_all(hellos + by_step.pop(0))
    # Every screen update is timed, not only the ones that follow a step: work the frame
    # leaves for later (charts drawn one per update) runs in the updates between steps.
    from textual.screen import Screen

    paint = Screen._on_timer_update

    def timed_update(screen: Screen) -> None:  # type: ignore[type-arg]
        t = time.perf_counter()
        paint(screen)
        UPDATES.append(time.perf_counter() - t)

    Screen._on_timer_update = timed_update  # type: ignore[method-assign]
    app = ZeroscopeApp(state)
    ingest, frame, cpu, charts = [], [], [], []
    ingest_cpu.clear()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        grid = app.screen.query_one(HistoryPlots)
        grid.min_interval_s = MIN_INTERVAL_S[plots]
        grid.display = plots != "off"
        await pilot.pause()
        built = sum(p.builds for p in app.screen.query(HistoryPlot))
        UPDATES.clear()  # from the first step on (not the start-up layout)
        for step in sorted(by_step):
            t0, c0 = time.perf_counter(), time.process_time()
            state.ingest_all(by_step[step])
            t1, c1 = time.perf_counter(), time.process_time()
            ingest_cpu.append(c1 - c0)
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
            before, built = built, sum(p.builds for p in app.screen.query(HistoryPlot))
            charts.append(built - before)
            # What a live view does between steps (the app redraws every 0.25 s): its screen
            # updates run, timed one by one in UPDATES.
            await asyncio.sleep(0.25)
        screen = app.screen
        VIEW[0] = next((v for v in ("nodes", "heatmap") if screen.has_class(v)), "table")
    Screen._on_timer_update = paint  # type: ignore[method-assign]
    return ingest, frame, cpu, charts


def bench_frames(
    ranks: int,
    frames: int,
    sizes: tuple[tuple[int, int], ...] = ((80, 24), (160, 48)),
    modes: tuple[str, ...] = PLOT_MODES,
) -> dict[str, dict[str, Any]]:
    """Median/max frame wall and CPU time, and one step's ingest, per terminal size and plot
    mode (the plain size key is the live mode), and the view the ranks' slot showed."""
    out = {}
    for size in sizes:
        for mode in modes:
            ingest, frame, cpu, charts = asyncio.run(_frames(ranks, frames, size, mode))
            slow = sum(u > 0.05 for u in UPDATES)
            print(f"  every screen update ({len(UPDATES)}): {_ms(UPDATES)}; over 50 ms: {slow}")
            print(
                f"cluster screen {size[0]}x{size[1]} ({VIEW[0]}), {ranks} ranks, plots {mode}: frame "
                f"{_ms(frame)} (CPU {_ms(cpu)}); ingest of one step {_ms(ingest)} "
                f"(CPU {_ms(ingest_cpu)}); "
                f"charts built {sum(charts)} over {len(charts)} steps (at most {max(charts)} a step)"
            )
            key = f"{size[0]}x{size[1]}" + ("" if mode == "live" else f", plots {mode}")
            out[key] = {
                "frame_s": statistics.median(frame),
                "frame_max_s": max(frame),
                "frame_cpu_s": statistics.median(cpu),
                "ingest_s": statistics.median(ingest),
                "ingest_cpu_s": statistics.median(ingest_cpu),
                "charts_max": max(charts),
                "update_max_s": max(UPDATES),
                "updates_over_50ms": slow,
                "view": VIEW[0],
            }
    return out


def build_trace(path: Path, ranks: int, reports: int) -> None:
    """A trace of ``reports`` step reports, written fast: the TraceWriter makes the file (schema,
    meta, Hellos), then the reports go in through one raw executemany of pre-encoded payloads
    (the writer's per-row path would take minutes for 10^6 rows)."""
    import msgspec

    from zeroscope.store.trace import TraceWriter

    steps = reports // ranks
    shape = RunShape(ranks=ranks, steps=1, collectives=False)
    hellos = [m for m in synthetic_run(shape) if isinstance(m, schema.Hello)]
    template = next(m for m in synthetic_run(shape) if isinstance(m, schema.StepReport))
    writer = TraceWriter(path, job_id=hellos[0].job_id)
    for h in hellos:
        writer.append(h, schema.encode(h))
    writer.close()
    # Pre-encode one payload per rank with sentinel step and wall_ns of fixed msgpack width
    # (uint32, uint64); each row then only splices the real values in. msgpack allows the wider
    # forms for small values, and the decoder reads them back exactly.
    step_mark, wall_mark = 0xFFFFFFF1, 0xFFFFFFFFFFFFFFF2
    step_bytes, wall_bytes = (
        b"\xce" + step_mark.to_bytes(4, "big"),
        b"\xcf" + wall_mark.to_bytes(8, "big"),
    )
    templates = []
    for rank in range(ranks):
        duration = template.duration_s * (1.3 if rank == 7 else 1.0)
        data = schema.encode(
            msgspec.structs.replace(
                template, rank=rank, step=step_mark, wall_ns=wall_mark, duration_s=duration
            )
        )
        i, j = data.index(step_bytes), data.index(wall_bytes)
        assert i < j, "StepReport field order changed: step must precede wall_ns"
        templates.append((rank, data[: i + 1], data[i + 5 : j + 1], data[j + 9 :]))

    def rows() -> Iterator[tuple[int, int, str, int, bytes]]:
        for step in range(steps):
            wall = template.wall_ns + step * 150_000_000
            s4, w8 = step.to_bytes(4, "big"), wall.to_bytes(8, "big")
            for rank, head, middle, tail in templates:
                yield step, rank, "step", wall, head + s4 + middle + w8 + tail

    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO messages(step, rank, kind, wall_ns, payload) VALUES (?, ?, ?, ?, ?)", rows()
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def bench_seek(ranks: int, reports: int, seeks: int) -> dict[str, Any]:
    """Median/max seek wall and CPU time, state rebuild time and the process's peak RSS."""
    from zeroscope.store.trace import TraceReader
    from zeroscope.tui.feed import ReplayFeed

    CACHE.mkdir(exist_ok=True)
    path = CACHE / f"trace-{ranks}x{reports}-v{schema.SCHEMA_VERSION}.zstrace"
    built_s = None
    if not path.exists():
        t0 = time.perf_counter()
        build_trace(path.with_suffix(".tmp"), ranks, reports)
        path.with_suffix(".tmp").rename(path)
        built_s = time.perf_counter() - t0
        print(
            f"built {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t0:.0f} s"
        )
    rss_base = _rss_kib("VmRSS") * 1024  # imports done; run in a fresh process for a true peak
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
    result = {
        "reports": reader.count("step"),
        "file_mb": path.stat().st_size / 1e6,
        "built_s": built_s,
        "seek_s": statistics.median(seek),
        "seek_max_s": max(seek),
        "seek_cpu_s": statistics.median(seek_cpu),
        "rebuild_s": statistics.median(rebuild),
        "rss_base": rss_base,
        "rss_peak": _rss_kib("VmHWM") * 1024,
    }
    reader.close()
    return result


def bench_seek_fresh(ranks: int, reports: int, seeks: int) -> dict[str, Any]:
    """bench_seek in a fresh process, so its peak RSS is the replay's (plus imports), not what
    earlier work in this process left behind."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        return pool.submit(bench_seek, ranks, reports, seeks).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--frames", type=int, default=20)
    parser.add_argument("--reports", type=int, default=1_000_000)
    parser.add_argument("--seeks", type=int, default=20)
    parser.add_argument(
        "--plots", nargs="+", choices=PLOT_MODES, default=PLOT_MODES, help="plot modes to time"
    )
    parser.add_argument("--sizes", nargs="+", default=["80x24", "160x48"], help="terminal sizes")
    parser.add_argument("--no-seek", action="store_true", help="frames and ingest only")
    args = parser.parse_args()
    sizes = tuple(tuple(int(v) for v in size.split("x")) for size in args.sizes)
    bench_frames(args.ranks, args.frames, sizes, tuple(args.plots))  # type: ignore[arg-type]
    if args.no_seek:
        return
    r = bench_seek_fresh(args.ranks, args.reports, args.seeks)
    print(
        f"replay process: RSS {r['rss_base'] / 2**20:.0f} MiB after imports, peak "
        f"{r['rss_peak'] / 2**20:.0f} MiB while opening the trace and seeking"
    )


if __name__ == "__main__":
    main()
