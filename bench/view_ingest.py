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

Steady-state garbage-collector policies of the viewer, compared in one tree (``--gc``): ``none``
(Python's defaults), ``catch-up`` (the Hellos and step 0 folded as a late viewer's catch-up,
frozen after), ``freeze-steps`` (``gc.freeze()`` after each closed step: the state's
long-lived objects leave the collector's sight), ``thresholds`` (``gc.set_threshold(50_000, 20,
100)``: fewer, not cheaper, collections). Each run prints its whole-heap (generation 2)
collections. ``--long N`` folds N steps of one step's reports renumbered as they go (no fixture
grows with N) and prints the process's RSS and frozen objects at N/2 and at N: a policy that
freezes objects later becoming cyclic garbage would grow both without bound. Both modes also
print the peak RSS of the steady steps, no collection forced: the largest RSS sampled after
every step, and the kernel's high-water mark (VmHWM, reset after the fixture is built and the
first fold done, where /proc allows), so the garbage a policy postpones between whole-heap
collections counts; and the long run a step's CPU, median and max.

``--work`` puts the model's work (tokens, counted FLOPs, the device's peak) in every report, as
the agent's reports of a model it saw run forward carry it: the step's close then also works
out the cluster's tokens/s and MFU over every rank's work (zeroscope.state.throughput), which
the fixture's reports without it skip.

``--relayed`` folds the reports as a viewer of a relayed job gets them: each passed through a
node relay's batcher (zeroscope/collector/relay_batch.py ``NodeBatcher``: the relay's own code,
which puts the summary every view needs inside the report) and decoded from the batch's bytes,
before the timed steps, so the timed ingest takes each report's summary as made instead of
folding its collectives (the viewer's decode of the report is outside the timed fold, as
without ``--relayed``). Everything else of the ingest and the step's close runs as it does.
"""

from __future__ import annotations

import argparse
import contextlib
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

from tests.fixtures import RunShape, split_by_step, synthetic_run  # noqa: E402
from zeroscope.state import ClusterState  # noqa: E402

GC_POLICIES = ("none", "catch-up", "freeze-steps", "thresholds")


def _set_policy(policy: str) -> None:
    if policy == "thresholds":
        gc.set_threshold(50_000, 20, 100)


def _after_step(policy: str) -> None:
    if policy == "freeze-steps":
        gc.freeze()


def _first_fold(policy: str) -> Any:
    """The Hellos and step 0 folded as a late viewer's catch-up (``catch-up``: the viewer's own
    policy, store/gc_pause.py; imported only then, so older trees run the other policies)."""
    if policy != "catch-up":
        return contextlib.nullcontext()
    from zeroscope.store.gc_pause import catch_up_fold

    return catch_up_fold()


def _full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


class _GcTime:
    """CPU time of the main thread inside garbage collections since it was made [s]."""

    def __init__(self) -> None:
        self.s = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.s += time.thread_time() - self._t0

    def close(self) -> float:
        gc.callbacks.remove(self._callback)
        return self.s


def _rss_mb(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _reset_hwm() -> bool:
    """Reset the kernel's peak RSS (VmHWM) to the current RSS; False where /proc refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _hwm_mb(reset: bool) -> float:
    return _rss_mb("VmHWM") if reset else float("nan")


def _relayed(run: list[Any]) -> list[Any]:
    """The run with every StepReport as a relay sends it on (``--relayed``, see the module
    docstring): through ``NodeBatcher`` in batches, and decoded from the batch's body."""
    from zeroscope.agent import schema
    from zeroscope.collector.relay_batch import NodeBatcher

    batcher = NodeBatcher(0, "bench")
    out: list[Any] = []
    waiting: list[int] = []  # where in ``out`` each report held in the batch goes

    def take() -> None:
        (header, body), _ = batcher.take()
        at = 0
        for where, entry in zip(waiting, schema.decode_batch(header).entries):
            out[where] = schema.decode(body[at : at + entry.size])
            at += entry.size
        waiting.clear()

    for m in run:
        out.append(m)
        if isinstance(m, schema.StepReport):
            waiting.append(len(out) - 1)
            batcher.add(m, schema.encode(m))
            if batcher.full:
                take()
    if waiting:
        take()
    return out


def bench(
    ranks: int,
    steps: int,
    freeze: bool = True,
    policy: str = "none",
    relayed: bool = False,
    work: bool = False,
) -> dict[str, float]:
    _set_policy(policy)
    extra = {"work": True} if work else {}  # only asked of a tree whose fixture has it
    shape = RunShape(ranks=ranks, steps=steps + 1, collectives=True, straggle_from=1, **extra)
    run = synthetic_run(shape)
    if relayed:
        run = _relayed(run)
    if freeze:
        # The fixture's messages, all built up front, are the bench's, not the viewer's (a live
        # viewer holds a rank's newest report): frozen, the collector does not walk them.
        gc.freeze()
    hellos, by_step = split_by_step(run)
    state = ClusterState()
    with _first_fold(policy):
        state.ingest_all(hellos + by_step.pop(0))
    wall, cpu = [], []
    rss0, hwm_reset = _rss_mb(), _reset_hwm()
    peak = rss0
    full0, gc_time = _full_collections(), _GcTime()
    for step in sorted(by_step):
        t0, c0 = time.perf_counter(), time.process_time()
        closed = state.ingest_all(by_step[step])
        _after_step(policy)
        t1, c1 = time.perf_counter(), time.process_time()
        assert [a.step for a in closed] == [step]
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        peak = max(peak, _rss_mb())
    out = {
        "rss0_mb": rss0,
        "peak_mb": peak,
        "hwm_mb": _hwm_mb(hwm_reset),
        "ingest_s": statistics.median(wall),
        "ingest_max_s": max(wall),
        "ingest_cpu_s": statistics.median(cpu),
        "per_report_us": statistics.median(cpu) / ranks * 1e6,
        "full_collections": _full_collections() - full0,
        "ingest_cpu_max_s": max(cpu),
        "gc_s": gc_time.close(),
    }
    return out


def long_run(ranks: int, steps: int, policy: str) -> dict[str, Any]:
    """``steps`` steps of one step's reports renumbered (past the state's history caps): the
    RSS and frozen objects at half-way and at the end, and the whole-heap collections."""
    import msgspec

    _set_policy(policy)
    hellos, by_step = split_by_step(synthetic_run(RunShape(ranks=ranks, steps=2, collectives=True)))
    template = by_step[1]
    state = ClusterState()
    state.ingest_all(hellos + by_step[0])
    gc.freeze()  # the template: the bench's, not the viewer's
    marks: dict[int, tuple[float, int]] = {}
    rss0, hwm_reset = _rss_mb(), _reset_hwm()
    peak, step_cpu = rss0, []
    full0, c0, gc_time = _full_collections(), time.process_time(), _GcTime()
    for step in range(1, steps + 1):
        s0 = time.process_time()
        shift = (step - 1) * 10**9
        msgs = [
            msgspec.structs.replace(m, step=step, wall_ns=m.wall_ns + shift)  # type: ignore[type-var]
            for m in template
        ]
        state.ingest_all(msgs)
        del msgs
        _after_step(policy)
        step_cpu.append(time.process_time() - s0)
        peak = max(peak, _rss_mb())
        if step in (steps // 2, steps):
            marks[step] = (_rss_mb(), gc.get_freeze_count())
    return {
        "marks": marks,
        "rss0_mb": rss0,
        "peak_mb": peak,
        "hwm_mb": _hwm_mb(hwm_reset),
        "step_cpu_s": statistics.median(step_cpu),
        "step_cpu_max_s": max(step_cpu),
        "full_collections": _full_collections() - full0,
        "cpu_s": time.process_time() - c0,
        "gc_s": gc_time.close(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--no-freeze", action="store_true", help="leave the fixture run unfrozen")
    parser.add_argument("--gc", choices=GC_POLICIES, default="none", help="steady-state policy")
    parser.add_argument("--long", type=int, default=0, help="steps of the RSS run (0: none)")
    parser.add_argument(
        "--relayed", action="store_true", help="the reports as a relay sends them on"
    )
    parser.add_argument(
        "--work", action="store_true", help="each report carries the model's work (tokens, FLOPs)"
    )
    args = parser.parse_args()
    load = os.getloadavg()[0]
    if args.long:
        lr = long_run(args.ranks, args.long, args.gc)
        marks = ", ".join(
            f"step {s}: RSS {rss:.0f} MB, {frozen} frozen"
            for s, (rss, frozen) in lr["marks"].items()
        )
        print(
            f"{args.long} steps of {args.ranks} ranks, gc {args.gc}: {marks}; "
            f"{lr['full_collections']} whole-heap collections, CPU {lr['cpu_s']:.1f} s "
            f"({lr['gc_s']:.1f} s in collections); RSS {lr['rss0_mb']:.0f} MB before the "
            f"steps, peak sampled after each {lr['peak_mb']:.0f} MB, VmHWM {lr['hwm_mb']:.0f} MB; "
            f"a step's CPU median {lr['step_cpu_s'] * 1e3:.1f} ms, max "
            f"{lr['step_cpu_max_s'] * 1e3:.1f} ms; load average {load:.1f} at the start"
        )
        return
    r = bench(args.ranks, args.steps, not args.no_freeze, args.gc, args.relayed, args.work)
    how = ", relayed (each report's summary made by its relay)" if args.relayed else ""
    how += ", with the model's work in every report" if args.work else ""
    print(
        f"ingest of one {args.ranks}-rank step{how}: wall median {r['ingest_s'] * 1e3:.1f} ms "
        f"(max {r['ingest_max_s'] * 1e3:.1f}), CPU median {r['ingest_cpu_s'] * 1e3:.1f} ms = "
        f"{r['per_report_us']:.1f} us a report (CPU max {r['ingest_cpu_max_s'] * 1e3:.1f}); "
        f"gc {args.gc}: {r['full_collections']} whole-heap collections, "
        f"{r['gc_s'] * 1e3:.0f} ms in collections; RSS {r['rss0_mb']:.0f} MB before the steps, "
        f"peak sampled after each {r['peak_mb']:.0f} MB, VmHWM {r['hwm_mb']:.0f} MB; load average {load:.1f} at the start"
    )


if __name__ == "__main__":
    main()
