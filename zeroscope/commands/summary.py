"""``zeroscope summary TRACE``: per-rank table and totals, computed from the trace alone.

Columns: steps, mean step time, peak P/G/O/A bytes, collective bytes per step, exposed % (the
share of collective time the loop waited for), busbw (nccl-tests convention, time-weighted over
all collectives: sum of S x bus factor / sum of durations), offload GB/s (transfer bytes / transfer
time) and overflow count. The trace is streamed through indexed queries, never loaded whole.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HELP = "per-rank table and totals of a recorded trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="trace file written by zeroscope run/serve")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


@dataclass(kw_only=True, slots=True)
class RankSummary:
    """Aggregates of one rank (or of all ranks, for the totals row)."""

    rank: int | None
    steps: int = 0
    mean_step_s: float | None = None
    params_peak: int | None = None
    grads_peak: int | None = None
    optim_peak: int | None = None
    activations_peak: int | None = None
    comm_bytes_per_step: float | None = None
    exposed_percent: float | None = None
    busbw_bytes_s: float | None = None
    offload_bytes_s: float | None = None
    overflows: int = 0
    _step_time: float = field(default=0.0, repr=False)
    _comm_bytes: int = field(default=0, repr=False)
    _comm_time: float = field(default=0.0, repr=False)
    _exposed: float = field(default=0.0, repr=False)
    _bus_bytes: float = field(default=0.0, repr=False)
    _xfer_bytes: int = field(default=0, repr=False)
    _xfer_time: float = field(default=0.0, repr=False)
    _collectives: int = field(default=0, repr=False)
    _transfers: int = field(default=0, repr=False)

    def add(self, report: Any) -> None:
        from zeroscope.agent.metrics import wire_bytes

        self.steps += 1
        self._step_time += report.duration_s
        m = report.memory
        self.params_peak = _max(self.params_peak, m.params)
        self.grads_peak = _max(self.grads_peak, m.grads)
        self.optim_peak = _max(self.optim_peak, m.optim)
        self.activations_peak = _max(self.activations_peak, m.activations)
        for c in report.collectives:
            self._collectives += 1
            self._comm_bytes += c.nbytes
            self._comm_time += c.duration_s
            self._exposed += c.exposed_s
            self._bus_bytes += wire_bytes(c.op, c.nbytes, c.group_size)
        for t in report.transfers:
            self._transfers += 1
            self._xfer_bytes += t.nbytes
            self._xfer_time += t.duration_s
        self.overflows += bool(report.overflow)

    def merge(self, other: RankSummary) -> None:
        for name in ("params_peak", "grads_peak", "optim_peak", "activations_peak"):
            setattr(self, name, _max(getattr(self, name), getattr(other, name)))
        for name in ("_step_time", "_comm_bytes", "_comm_time", "_exposed", "_bus_bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("_xfer_bytes", "_xfer_time", "_collectives", "_transfers", "steps"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.overflows = max(self.overflows, other.overflows)  # an overflow skips every rank

    def finish(self) -> RankSummary:
        if self.steps:
            self.mean_step_s = self._step_time / self.steps
            self.comm_bytes_per_step = self._comm_bytes / self.steps
        if self._collectives:
            self.exposed_percent = (
                100.0 * self._exposed / self._comm_time if self._comm_time else 0.0
            )
            self.busbw_bytes_s = self._bus_bytes / self._comm_time if self._comm_time else None
        if self._transfers and self._xfer_time > 0:
            self.offload_bytes_s = self._xfer_bytes / self._xfer_time
        return self

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def summarize(path: Path) -> dict[str, Any]:
    """Per-rank and total aggregates of a trace (raises TraceError for a bad file)."""
    from zeroscope.agent.schema import StepReport
    from zeroscope.state.mesh import PipelineRun, parallel_fields
    from zeroscope.trace import TraceReader

    with TraceReader(path) as reader:
        hellos = reader.hellos()
        ranks: dict[int, RankSummary] = {h.rank: RankSummary(rank=h.rank) for h in hellos}
        pipeline = PipelineRun(hellos)
        for msg in reader.messages(kinds=["step"]):
            if isinstance(msg, StepReport):
                ranks.setdefault(msg.rank, RankSummary(rank=msg.rank)).add(msg)
                pipeline.add(msg)
        job_id = reader.job_id
        steps = reader.steps()
        events = reader.count("event")
    total = RankSummary(rank=None)
    for r in ranks.values():
        total.merge(r)
    per_rank = [ranks[r].finish() for r in sorted(ranks)]
    steps_max = max((r.steps for r in per_rank), default=0)
    total.finish()
    # All ranks' collective bytes per step (a step is counted once, not once per rank).
    total.comm_bytes_per_step = (
        total._comm_bytes / steps_max if steps_max and total._collectives else None
    )
    total.steps = steps_max
    hello_of = {h.rank: h for h in hellos}
    return {
        "trace": str(path),
        "job_id": job_id,
        "world_size": hellos[0].world_size if hellos else len(per_rank),
        "step_range": list(steps) if steps else None,
        "events": events,
        "ranks": [
            {
                **r.public(),
                **parallel_fields(hello_of.get(r.rank), r.rank or 0, pipeline),
            }
            for r in per_rank
        ],
        "total": total.public(),
    }


def _bytes(v: float | None) -> str:
    if v is None:
        return "NA"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= size:
            return f"{v / size:.2f} {unit}"
    return f"{v:.0f} B"


def _rate(v: float | None) -> str:
    return "NA" if v is None else f"{v / 1e9:.3f}"


def format_table(summary: dict[str, Any]) -> str:
    head = (
        "rank",
        "steps",
        "step ms",
        "P peak",
        "G peak",
        "O peak",
        "A peak",
        "comm/step",
        "exposed%",
        "busbw GB/s",
        "offload GB/s",
        "overflows",
    )
    rows = [head]
    for r in [*summary["ranks"], summary["total"]]:
        rows.append(
            (
                "all" if r["rank"] is None else str(r["rank"]),
                str(r["steps"]),
                "NA" if r["mean_step_s"] is None else f"{r['mean_step_s'] * 1e3:.1f}",
                _bytes(r["params_peak"]),
                _bytes(r["grads_peak"]),
                _bytes(r["optim_peak"]),
                _bytes(r["activations_peak"]),
                _bytes(r["comm_bytes_per_step"]),
                "NA" if r["exposed_percent"] is None else f"{r['exposed_percent']:.1f}",
                _rate(r["busbw_bytes_s"]),
                _rate(r["offload_bytes_s"]),
                str(r["overflows"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        f"trace {summary['trace']}  job {summary['job_id'] or '?'}  "
        f"world {summary['world_size']}  steps {summary['step_range']}  events {summary['events']}"
    ]
    for i, row in enumerate(rows):
        if i == len(rows) - 1:
            lines.append("  ".join("-" * w for w in widths))
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError
    from zeroscope.trace import TraceError

    try:
        summary = summarize(args.trace)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_table(summary))
    return 0
