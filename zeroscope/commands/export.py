"""``zeroscope export TRACE --format chrome -o out.json``: the trace as Chrome trace-event JSON,
which Perfetto (ui.perfetto.dev) and chrome://tracing load.

One process track per rank (pid = rank). Thread 0 holds a slice per step with its phases nested
inside; collectives and offload transfers get their own threads, one lane per overlap (slices
on one thread must nest), with bytes, group size, exposed time and busbw as arguments. Memory
(P, G, O, A, allocator) is a counter track per rank; events are instant markers. Time 0 is the
earliest instant anything in the trace starts (a step, a collective issued before its step
began, such as an init broadcast, or an event): every timestamp is >= 0, and all are shifted
alike, which keeps their order and their distances.

Placement: a step ends at its report's wall clock and starts ``duration_s`` earlier; phases
(``StepReport.phase_spans``), collectives and transfers are placed relative to the step start,
on the same axis. Reports from reporters that give only phase sums get their phases laid back
to back (data, forward, backward, optimizer). Each rank's timeline uses that rank's own clock.

The document's ``otherData.figures`` is the run report of zeroscope.state.report (the figures
of ``zeroscope summary --json``), computed by feeding the same messages through ClusterState.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "convert a trace (e.g. to Chrome/Perfetto JSON)"

_PHASES = ("data", "forward", "backward", "optimizer", "eval")
_TID_STEPS, _TID_COMM, _TID_XFER = 0, 100, 200


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="trace file written by zeroscope run/serve")
    parser.add_argument("--format", choices=["chrome"], default="chrome", help="output format")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        help="output file (default, or '-': stdout)",
    )


class _Lanes:
    """Greedy lane assignment so slices on one thread never partially overlap."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def place(self, start: float, end: float) -> int:
        for i, e in enumerate(self.ends):
            if e <= start:
                self.ends[i] = end
                return i
        self.ends.append(end)
        return len(self.ends) - 1


def _phase_slices(msg: Any, start_us: float, end_us: float) -> list[tuple[str, float, float]]:
    """(name, ts, dur) of the step's phases on its own axis, clipped to the step."""
    if msg.phase_spans:
        out = []
        for span in msg.phase_spans:
            ts = start_us + max(span.start_s, 0.0) * 1e6
            dur = min(span.duration_s * 1e6, max(end_us - ts, 0.0))
            out.append((span.name, ts, dur))
        return out
    laid, t = [], start_us
    for name in _PHASES:
        d = getattr(msg.phases, name)
        if d is None:
            continue
        dur = min(d * 1e6, max(end_us - t, 0.0))
        laid.append((name, t, dur))
        t += dur
    return laid


def chrome_events(path: Path, figures: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Trace-event dicts for every rank's steps, collectives, transfers, memory and events.
    With ``figures`` (a dict), the run report of zeroscope.state.report is put in it."""
    from zeroscope.agent.schema import Event, StepReport
    from zeroscope.state.viewmodel import ClusterState, collective_figures, run_report
    from zeroscope.store.feed import feed_trace
    from zeroscope.store.trace import TraceReader

    out: list[dict[str, Any]] = []
    state = ClusterState()
    with TraceReader(path) as reader:
        hellos = {h.rank: h for h in reader.hellos()}
        origin: int | None = None
        lanes: dict[tuple[int, int], _Lanes] = {}
        named: set[tuple[int, int]] = set()

        def thread(pid: int, tid: int, name: str) -> None:
            if (pid, tid) not in named:
                named.add((pid, tid))
                out.append(
                    {
                        "ph": "M",
                        "name": "thread_name",
                        "pid": pid,
                        "tid": tid,
                        "args": {"name": name},
                    }
                )

        for rank, h in hellos.items():
            label = f"rank {rank} ({h.hostname}, {h.device})" if h.hostname else f"rank {rank}"
            out.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": label}})
            out.append(
                {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}}
            )
        for msg, _ in feed_trace(reader, state):
            if not isinstance(msg, (Event, StepReport)):
                continue
            if origin is None:
                origin = msg.wall_ns - int(getattr(msg, "duration_s", 0.0) * 1e9)
            pid = msg.rank
            end_us = (msg.wall_ns - origin) / 1e3
            if isinstance(msg, Event):
                out.append(
                    {
                        "ph": "i",
                        "s": "p",
                        "name": msg.event,
                        "pid": pid,
                        "tid": _TID_STEPS,
                        "ts": end_us,
                        "args": {"step": msg.step, "message": msg.message, "value": msg.value},
                    }
                )
                continue
            if not isinstance(msg, StepReport):
                continue
            start_us = end_us - msg.duration_s * 1e6
            thread(pid, _TID_STEPS, "steps")
            out.append(
                {
                    "ph": "X",
                    "name": f"step {msg.step}",
                    "pid": pid,
                    "tid": _TID_STEPS,
                    "ts": start_us,
                    "dur": msg.duration_s * 1e6,
                    "args": {"loss": msg.loss, "overflow": msg.overflow, "lr": msg.lr},
                }
            )
            for name, ts, dur in _phase_slices(msg, start_us, end_us):
                out.append(
                    {"ph": "X", "name": name, "pid": pid, "tid": _TID_STEPS, "ts": ts, "dur": dur}
                )
            for c in msg.collectives:
                # A collective no clock measured is an instant at its issue: no duration, and
                # NA (null) for its busbw and exposed time.
                s = start_us + c.start_s * 1e6
                fig = collective_figures(c)
                duration = fig["duration_s"]
                dur_us = 0.0 if duration is None else duration * 1e6
                lane = lanes.setdefault((pid, _TID_COMM), _Lanes()).place(s, s + dur_us)
                thread(pid, _TID_COMM + lane, f"collectives {lane}")
                bw, exposed = fig["busbw_bytes_s"], fig["exposed_s"]
                event: dict[str, Any] = {
                    "ph": "X" if duration is not None else "i",
                    "name": c.op + (f" {c.label}" if c.label else ""),
                    "pid": pid,
                    "tid": _TID_COMM + lane,
                    "ts": s,
                    "args": {
                        "bytes": c.nbytes,
                        "volume_bytes": fig["volume_bytes"],
                        "group_size": c.group_size,
                        "exposed_ms": None if exposed is None else exposed * 1e3,
                        "busbw_GBps": None if bw is None else bw / 1e9,
                        "clock": c.clock,
                        "step": msg.step,
                    },
                }
                if duration is not None:
                    event["dur"] = dur_us
                else:
                    event["s"] = "t"  # an instant on its thread
                out.append(event)
            for x in msg.transfers:
                s = start_us + x.start_s * 1e6
                lane = lanes.setdefault((pid, _TID_XFER), _Lanes()).place(s, s + x.duration_s * 1e6)
                thread(pid, _TID_XFER + lane, f"offload {lane}")
                out.append(
                    {
                        "ph": "X",
                        "name": x.direction + (f" {x.label}" if x.label else ""),
                        "pid": pid,
                        "tid": _TID_XFER + lane,
                        "ts": s,
                        "dur": x.duration_s * 1e6,
                        "args": {"bytes": x.nbytes},
                    }
                )
            m = msg.memory
            counters = {
                "P": m.params,
                "G": m.grads,
                "O": m.optim,
                "A": m.activations,
                "allocated": m.device_allocated,
                "reserved": m.device_reserved,
            }
            out.append(
                {
                    "ph": "C",
                    "name": "memory bytes",
                    "pid": pid,
                    "ts": end_us,
                    "args": {k: v for k, v in counters.items() if v is not None},
                }
            )
    if figures is not None:
        figures.update(run_report(state))
    _start_at_zero(out)
    return out


def _start_at_zero(events: list[dict[str, Any]]) -> None:
    """Shift every timestamp so the earliest is 0. ``ts - earliest`` is exactly 0 for the
    earliest and >= 0 for the rest (float subtraction rounds monotonically), so neither float
    noise (a step at -2.9e-11) nor a collective issued before its step began is negative."""
    stamps = [e["ts"] for e in events if "ts" in e]
    if not stamps:
        return
    earliest = min(stamps)
    for e in events:
        if "ts" in e:
            e["ts"] -= earliest


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError
    from zeroscope.store.trace import TraceError

    figures: dict[str, Any] = {}
    try:
        events = chrome_events(args.trace, figures)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    doc = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"figures": figures}}
    if args.output is None or str(args.output) == "-":
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        try:
            args.output.write_text(json.dumps(doc))
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror}") from None
        print(f"wrote {len(events)} events to {args.output}", file=sys.stderr)
    return 0
