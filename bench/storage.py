"""Bounded storage: what the trace costs per rank-step, kept in full and thinned, projected to
16,384 ranks at 1 step/s; and what a late viewer of a 16,384-rank job gets first.

Trace: a synthetic ZeRO-3 job (tests/fixtures.py's run: 18 collectives, two transfers, a host
sample per report, a straggler from step 1) is written through the collector's TraceWriter,
once keeping everything and once with the default thinning policy (store/thinning.py), one
commit per step as the collector's 0.2 s batches make at 1 step/s. The thinned trace's growth
is measured between two points well past the recent window (the file's size after a WAL
checkpoint), per rank-step, and projected linearly (every term of the policy scales with the
ranks); beside it, the policy's own formula with the measured row sizes. The writer's CPU per
step (append, commit, thinning) is timed too.

Late viewer: a collector (in this process, not recording) takes ``--viewer-steps`` steps of
16,384 ranks' reports from a PUSH socket; then a LiveSource connects and the time to its first
cluster frame is measured: catch-up received, folded into a ClusterState, the Textual cluster
screen drawn once at 160x48. Reported: the catch-up's bytes (the state snapshot, against the
history the old catch-up sent), the time, and the collector's RSS growth.

``--relayed``: the reports carry the summary a node relay puts in each (``StepReport.summary``),
as a relayed job's trace and a late viewer's catch-up hold them.

Usage: ``python bench/storage.py [--ranks 1024] [--viewer-ranks 16384] [--relayed]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RANKS_TARGET = 16_384
STEPS_PER_HOUR = 3600


def _template(ranks: int) -> tuple[list[Any], list[Any]]:
    """(hellos, one step's reports) of a synthetic ZeRO-3 job of ``ranks`` ranks."""
    from tests.fixtures import RunShape, synthetic_run
    from zeroscope.agent import schema

    run = synthetic_run(RunShape(ranks=ranks, steps=1, straggle_from=0, overflow_steps=()))
    hellos = [m for m in run if isinstance(m, schema.Hello)]
    reports = [m for m in run if isinstance(m, schema.StepReport)]
    return hellos, reports


def _summaries(template: list[Any], relayed: bool) -> list[Any]:
    """Each template report's summary as its node's relay makes it (``relayed``), else None.
    A report's summary differs from step to step only in its step and end (the template's
    figures are the same every step): made once, renumbered with the report."""
    from zeroscope.state.rank import summarize

    return [summarize(r) if relayed else None for r in template]


def _renumbered(report: Any, summary: Any, step: int) -> Any:
    """The template's report as step ``step`` sends it, with its summary if it has one."""
    wall_ns = report.wall_ns + step * 10**9
    if summary is not None:
        summary = msgspec.structs.replace(summary, step=step, wall_ns=wall_ns)
    return msgspec.structs.replace(report, step=step, wall_ns=wall_ns, summary=summary)


def _size(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def trace_growth(ranks: int, steps: int, policy: Any, relayed: bool = False) -> dict[str, Any]:
    """Write ``steps`` steps of ``ranks`` ranks; the file's growth over the last half.
    ``relayed``: each report carries the summary a node relay puts in it (StepReport.summary,
    zeroscope/collector/relay_batch.py), as a relayed job's trace holds them."""
    from zeroscope.agent import schema
    from zeroscope.store.trace import TraceWriter

    hellos, template = _template(ranks)
    summaries = _summaries(template, relayed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.zstrace"
        w = TraceWriter(path, thinning=policy, commit_interval=3600, commit_rows=10**9)
        for h in hellos:
            w.append(h, schema.encode(h))
        w.commit()
        # Measured over exactly two thinning periods (each keeps one step), well past the
        # window: the file then grows by what the policy keeps.
        mark = steps - 2 * policy.every if policy is not None else steps // 2
        cpu = 0.0
        size_at: dict[int, int] = {}
        payload_bytes = 0
        for step in range(1, steps + 1):
            batch = []
            for r, summary in zip(template, summaries):
                m = _renumbered(r, summary, step)
                payload = schema.encode(m)
                payload_bytes += len(payload)
                batch.append((m, payload))
            c0 = time.process_time()
            w.append_many(batch)
            w.commit()
            cpu += time.process_time() - c0
            if step in (mark, steps):
                w._checkpoint("TRUNCATE")
                size_at[step] = _size(path)
        w.close()
    grown = size_at[steps] - size_at[mark]
    rank_steps = ranks * (steps - mark)
    return {
        "ranks": ranks,
        "steps": steps,
        "relayed": relayed,
        "payload_per_report": payload_bytes / (ranks * steps),
        "bytes_per_rank_step": grown / rank_steps,
        "writer_cpu_ms_per_step": cpu / steps * 1e3,
        "size_bytes": size_at[steps],
    }


def late_viewer(
    ranks: int, steps: int, gc_policy: bool = True, relayed: bool = False
) -> dict[str, Any]:
    """A collector with ``steps`` steps of ``ranks`` ranks; a viewer's first frame. The fold
    goes through the viewer's garbage-collector policy for a catch-up (store/gc_pause.py, as
    the TUI's feed worker and headless attach fold it); ``gc_policy`` False folds it as before
    that policy, with the collector running (the paired "before"). ``relayed``: each report
    carries the summary its node's relay would put in it, so the catch-up's reports do too."""
    import zmq

    from zeroscope.agent import schema
    from zeroscope.agent.publish import set_credentials
    from zeroscope.collector.server import Collector, wait_for
    from zeroscope.state import ClusterState
    from zeroscope.store.sources import LiveSource

    hellos, template = _template(ranks)
    summaries = _summaries(template, relayed)
    rss0 = _rss()
    clock = _GcClock()
    col = Collector().start()
    push: zmq.Socket = zmq.Context.instance().socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 0)
    set_credentials(push)
    push.connect(col.ingest_address)
    sent = len(hellos)
    payloads = [schema.encode(h) for h in hellos]
    for i in range(0, len(payloads), 64):
        push.send_multipart([b"", *payloads[i : i + 64]])
    for step in range(1, steps + 1):
        payloads = [schema.encode(_renumbered(r, s, step)) for r, s in zip(template, summaries)]
        for i in range(0, len(payloads), 64):
            push.send_multipart([b"", *payloads[i : i + 64]])
        sent += len(payloads)
    if not wait_for(lambda: col.accepted >= sent, timeout=600):
        raise RuntimeError(f"collector accepted {col.accepted} of {sent}")
    push.close()
    rss_collector = _rss() - rss0
    history = col._history_size  # what a catch-up from seq 0 sent before the state snapshot
    t0, c0 = time.perf_counter(), time.process_time()
    src = LiveSource(col.viewer_address)
    got: list[Any] = []
    while not (src.caught_up and src.last_seq >= col.seq) and time.perf_counter() - t0 < 300:
        got += src.poll(0.1)
    t_received, c_received = time.perf_counter() - t0, time.process_time() - c0
    gc_received = clock.read()
    state = ClusterState()
    policy: Any = contextlib.nullcontext()
    if gc_policy:  # imported only then: a copy of this file times a tree without the policy
        from zeroscope.store.gc_pause import catch_up_fold, is_catch_up

        policy = catch_up_fold(is_catch_up(len(got)), freeze=src.snapshots > 0)
    with policy:
        state.ingest_all(got)
    t_folded, c_folded = time.perf_counter() - t0, time.process_time() - c0
    gc_folded = clock.read()
    frame_s = asyncio.run(_first_frame(state))
    t_frame, c_frame = time.perf_counter() - t0, time.process_time() - c0
    gc_frame = clock.read()
    clock.close()
    snapshot_bytes = sum(len(schema.encode(m)) for m in got)
    src.close()
    col.stop()
    return {
        "ranks": ranks,
        "steps": steps,
        "snapshot_bytes": snapshot_bytes,
        "snapshot_messages": len(got),
        "history_bytes": history,
        "received_s": t_received,
        "folded_s": t_folded,
        "frame_s": frame_s,
        "first_frame_s": t_frame,
        "received_cpu_s": c_received,
        "folded_cpu_s": c_folded,
        "first_frame_cpu_s": c_frame,
        "collector_rss_bytes": rss_collector,
        "state_frames": src.snapshots,
        "gc_policy": gc_policy,
        "relayed": relayed,
        # The viewer's (main thread's) collections in each phase: (seconds, whole-heap ones).
        "gc_received": gc_received,
        "gc_fold": gc_folded,
        "gc_frame": gc_frame,
        "frozen_objects": gc.get_freeze_count(),
        "load": os.getloadavg()[0],
    }


async def _first_frame(state: Any) -> float:
    """The cluster screen's first frame at 160x48 over ``state`` [s]."""
    from zeroscope.tui.app import ZeroscopeApp

    t = time.perf_counter()
    app = ZeroscopeApp(state)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot._wait_for_screen()
        app.screen._on_timer_update()
        took = time.perf_counter() - t
    return took


class _GcClock:
    """CPU time in the main thread's garbage collections, and the whole-heap (generation 2)
    ones among them; ``read`` returns both since the last read."""

    def __init__(self) -> None:
        import threading

        self.ns = self.full = self._t0 = 0
        self._main = threading.get_ident()
        self._ident = threading.get_ident
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if self._ident() != self._main:
            return
        if phase == "start":
            self._t0 = time.thread_time_ns()
        else:
            self.ns += time.thread_time_ns() - self._t0
            self.full += info.get("generation") == 2

    def read(self) -> tuple[float, int]:
        out = (round(self.ns / 1e9, 3), self.full)
        self.ns = self.full = 0
        return out

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1024, help="ranks of the trace's synthetic job")
    p.add_argument("--steps", type=int, default=1056, help="steps written (past the window)")
    p.add_argument("--full-steps", type=int, default=40, help="steps of the unthinned trace")
    p.add_argument("--viewer-ranks", type=int, default=RANKS_TARGET)
    p.add_argument("--viewer-steps", type=int, default=4)
    p.add_argument("--viewer-only", action="store_true", help="only the late viewer")
    p.add_argument("--relayed", action="store_true", help="reports carrying a relay's summaries")
    p.add_argument(
        "--no-gc-policy", action="store_true", help="fold the catch-up with the collector running"
    )
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    from zeroscope.store.thinning import ThinningPolicy

    if args.viewer_only:
        return {
            "viewer": late_viewer(
                args.viewer_ranks, args.viewer_steps, not args.no_gc_policy, args.relayed
            )
        }

    # The default policy's every and recent, applied at any size (its from_ranks only says
    # which jobs are thinned; the cost per rank-step does not depend on it).
    default = ThinningPolicy()
    policy = ThinningPolicy(every=default.every, recent=default.recent, from_ranks=1)
    full = trace_growth(args.ranks, args.full_steps, None, args.relayed)
    thinned = trace_growth(args.ranks, args.steps, policy, args.relayed)
    per_hour = RANKS_TARGET * STEPS_PER_HOUR
    for r in (full, thinned):
        r["gb_per_hour_16k"] = r["bytes_per_rank_step"] * per_hour / 1e9
    # The policy's formula: the kept steps' reports at the full trace's row cost, plus one
    # node row per 8 ranks per step (what the thinned trace's growth has beyond the reports).
    formula = full["bytes_per_rank_step"] / policy.every
    thinned["formula_bytes_per_rank_step"] = formula
    viewer = late_viewer(args.viewer_ranks, args.viewer_steps, not args.no_gc_policy, args.relayed)
    return {"policy": policy, "full": full, "thinned": thinned, "viewer": viewer}


def main() -> None:
    out = run(parser().parse_args())
    for key in ("full", "thinned", "viewer"):
        if key in out:
            print(key, out[key])


if __name__ == "__main__":
    main()
