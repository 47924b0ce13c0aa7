"""``zeroscope summary TRACE``: the run's figures and per-rank table, from the trace alone.

The trace is streamed (indexed queries, never loaded whole) through the very ClusterState the
live view and ``replay`` use, and the figures are read off it (zeroscope.state.report): the
summary, the live view's final lines, ``replay --headless`` and ``export`` agree by
construction. Per-step figures are over steady steps (the first step's one-off traffic and
warm-up left out, zeroscope.state.totals). Columns: steps, mean step time, peak P/G/O/A bytes,
communication volume per step (all-reduce counts twice), exposed % (the share of the step the
loop waited in collectives), busbw (nccl-tests convention, time-weighted), offload GB/s and
overflow count. ``--json`` adds the cluster figures (``steps_per_s``, ``samples_per_s``,
``alerts``) beside the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "per-rank table and totals of a recorded trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", type=Path, help="trace file written by zeroscope run/serve")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def state_of(path: Path) -> tuple[Any, dict[str, Any]]:
    """(ClusterState after the whole trace, facts of the trace file itself). Raises
    TraceError for a bad file. The trace is folded by zeroscope.store.feed, as every reader of
    a trace does."""
    from zeroscope.store.feed import state_of_trace
    from zeroscope.store.trace import TraceReader

    with TraceReader(path) as reader:
        state = state_of_trace(reader)
        steps = reader.steps("step")  # the steps reported, not the one a crash was in
        facts = {
            "trace": str(path),
            "job_id": reader.job_id or state.job_id,
            "step_range": list(steps) if steps else None,
            "events": reader.count("event"),
        }
    return state, facts


def summarize(path: Path) -> dict[str, Any]:
    """The run report of a trace (zeroscope.state.report) with the trace's own facts; each
    rank also gets its ``mesh`` coordinates and, in a pipeline job, its ``pipeline`` figures
    (zeroscope.state.mesh)."""
    from zeroscope.state.viewmodel import parallel_fields, run_report

    state, facts = state_of(path)
    report = run_report(state)
    out = {**facts, **{k: v for k, v in report.items() if k != "job_id"}}
    hellos = {r: rs.hello for r, rs in state.ranks.items() if rs.hello is not None}
    pipeline = _pipeline_run(path, list(hellos.values()))
    for row in out["ranks"]:
        row.update(parallel_fields(hellos.get(row["rank"]), row["rank"], pipeline))
    return out


def _pipeline_run(path: Path, hellos: list[Any]) -> Any:
    """Every rank's pipeline figures over the run: a second pass over the step reports, made
    only for a job that reported a pipeline layout."""
    from zeroscope.agent.schema import StepReport
    from zeroscope.state.viewmodel import PipelineRun
    from zeroscope.store.trace import TraceReader

    run = PipelineRun(hellos)
    if run.layouts:
        with TraceReader(path) as reader:
            for msg in reader.messages(kinds=["step"]):
                if isinstance(msg, StepReport):
                    run.add(msg)
    return run


def _bytes(v: float | None) -> str:
    """Sizes as every view prints them (zeroscope.state.units: decimal, 1 MB = 1e6 bytes)."""
    from zeroscope.state import units

    return units.size(v)


def _params(v: float | None, frozen: float | None) -> str:
    """P peak with its frozen share (zeroscope.state.units.params_size)."""
    from zeroscope.state import units

    return units.params_size(v, frozen)


def _rate(v: float | None) -> str:
    return "NA" if v is None else f"{v / 1e9:.3f}"


def _exposed(row: dict[str, Any]) -> str:
    """The exposed share, marked ``!`` where its level is bad (above the exposed alert's
    threshold, as the screens colour it)."""
    if row["exposed_percent"] is None:
        return "NA"
    return f"{row['exposed_percent']:.1f}" + ("!" if row.get("exposed_level") == "bad" else "")


def format_table(summary: dict[str, Any]) -> str:
    from zeroscope.state.viewmodel import throughput_line

    # The host column when something was offloaded: an offloaded run's G and O on the device
    # read 0B, and what moved to host memory was only in --json.
    host = any(r.get("host_peak") for r in summary["ranks"])
    head = (
        "rank",
        "steps",
        "step ms",
        "P peak",
        "G peak",
        "O peak",
        "A peak",
        *(("host peak",) if host else ()),
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
                _params(r["params_peak"], r.get("frozen_params_peak")),
                _bytes(r["grads_peak"]),
                _bytes(r["optim_peak"]),
                _bytes(r["activations_peak"]),
                *((_bytes(r["host_peak"]),) if host else ()),
                _bytes(r["comm_bytes_per_step"]),
                _exposed(r),
                _rate(r["busbw_bytes_s"]),
                _rate(r["offload_bytes_s"]),
                str(r["overflows"]),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    steps_s, samples_s = summary["steps_per_s"], summary["samples_per_s"]
    lines = [
        f"trace {summary['trace']}  job {summary['job_id'] or '?'}  "
        f"world {summary['world_size']}  steps {summary['step_range']}  events {summary['events']}",
        f"{'NA' if steps_s is None else f'{steps_s:.3f}'} steps/s  "
        f"{'NA' if samples_s is None else f'{samples_s:.2f}'} samples/s  "
        "(per-step figures over steady steps: the first step's one-off traffic left out)",
        *([f"samples/s NA: {summary['samples_na']}"] if summary.get("samples_na") else []),
        throughput_line(
            summary["tokens_per_s"],
            summary["tflops_per_s"],
            summary["mfu"],
            summary["peak_tflops"],
            summary["peak_source"],
            summary["throughput_over"],
            summary["throughput_na"],
        ),
    ]
    lines += _missing_lines(summary["missing_ranks"])
    for i, row in enumerate(rows):
        if i == len(rows) - 1:
            lines.append("  ".join("-" * w for w in widths))
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    lines.append(
        "all: steps, step ms (1 / steps per second: below the slowest rank's own mean when "
        "ranks end their steps at different times), exposed% and overflows of the cluster; "
        "P/G/O/A peak = max over ranks"
        + ("; host peak = offloaded P+G+O in host memory, max over ranks" if host else "")
        + "; comm/step = sum over ranks; busbw, offload = over every rank's operations; "
        "! exposed above the alert's threshold"
    )
    if summary.get("untimed_collectives"):
        lines.append(
            f"busbw NA: {summary['untimed_collectives']:,} of {summary['collectives']:,} "
            "collectives (steady steps, every rank) had no clock to time them, so their bytes "
            "and counts are exact and their time unknown (on gloo, DDP's bucket all-reduces: "
            "torch's Flight Recorder gives them no duration; docs/engines/timing.md)"
        )
    if summary.get("job_stopped"):
        lines.append(f"job stopped on request ({summary['job_stopped']})")
    lines += [f"alert: {a['detail']}" for a in summary["alerts"]]
    if summary.get("thinned"):
        from zeroscope.state.viewmodel import THINNED_FIGURES

        lines.append(f"{summary['thinned']}; {THINNED_FIGURES}")
    return "\n".join(lines)


def _missing_lines(missing: list[dict]) -> list[str]:
    """``missing r8-15 (node 1): <reason>``: one line per node and reason."""
    from zeroscope.state.viewmodel import MissingGroup

    grouped: dict[tuple[Any, str, str], list[int]] = {}
    for row in missing:
        grouped.setdefault((row["node"], row["reason"], row["message"]), []).append(row["rank"])
    return [
        "missing " + MissingGroup(tuple(ranks), node, reason, message).text
        for (node, reason, message), ranks in grouped.items()
    ]


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError
    from zeroscope.store.trace import TraceError

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
