"""What the printing verbs do with their output: a reader that goes away (``| head``) ends them
quietly, and the Chrome export's clock starts at 0 for the earliest thing in the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import BASE_NS, synthetic_run, write_trace
from zeroscope.agent.schema import SCHEMA_VERSION, Collective, Event, Hello, StepReport
from zeroscope.cli import PIPE_CLOSED, main

ROOT = Path(__file__).resolve().parent.parent


def _reader_gone(*argv: str, cwd: Path) -> tuple[int, str]:
    """Run a verb whose stdout reader is gone before the first byte (``| head -0``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zeroscope", *argv],
        cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=120), err


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipes") / "run.zstrace"
    write_trace(path, synthetic_run())
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--headless"],
        ["summary", "--json"],
        ["summary"],
        ["export", "--format", "chrome"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_printing_verb_ends_quietly_when_its_reader_goes(argv: list[str], trace: Path) -> None:
    code, err = _reader_gone(*argv, str(trace), cwd=trace.parent)
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored" either
    assert code == PIPE_CLOSED == 141  # as a shell reports a SIGPIPE death


def _skewed_trace(path: Path) -> list[tuple[str, int, int]]:
    """Two ranks whose first instants come from different things: rank 1's clock runs 5 ms
    behind, and rank 0 issued a broadcast 37 ms before its first step began (an init
    broadcast). Returns (name, rank, start ns) of every slice, from integer nanoseconds."""
    messages: list = [
        Hello(schema_version=SCHEMA_VERSION, job_id="skew", rank=r, world_size=2) for r in (0, 1)
    ]
    starts = []
    for step in (1, 2):
        for rank in (0, 1):
            duration_s = 0.1 + 0.01 * rank + 1e-9 / 3  # not a whole number of ns
            end_ns = BASE_NS + step * 200_000_000 - rank * 5_000_000
            start_ns = end_ns - round(duration_s * 1e9)
            broadcast = -0.037 if (step, rank) == (1, 0) else 0.01
            messages.append(
                StepReport(
                    rank=rank,
                    step=step,
                    wall_ns=end_ns,
                    duration_s=duration_s,
                    collectives=[
                        Collective("broadcast", 1024, 2, broadcast, 0.002, 0.002, label=f"s{step}")
                    ],
                )
            )
            starts.append((f"step {step}", rank, start_ns))
            starts.append((f"broadcast s{step}", rank, start_ns + round(broadcast * 1e9)))
    messages.append(Event(rank=1, step=2, wall_ns=BASE_NS + 150_000_000, event="checkpoint"))
    starts.append(("checkpoint", 1, BASE_NS + 150_000_000))
    write_trace(path, messages)
    return starts


def test_the_chrome_export_starts_at_zero_and_keeps_the_order(tmp_path: Path) -> None:
    path = tmp_path / "skew.zstrace"
    expected = _skewed_trace(path)
    out = tmp_path / "t.json"
    assert main(["export", str(path), "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    timed = [e for e in events if "ts" in e]
    assert min(e["ts"] for e in timed) == 0.0 and all(e["ts"] >= 0 for e in timed)
    got = {(e["name"], e["pid"]): e["ts"] for e in timed if e["ph"] in ("X", "i")}
    origin = min(ns for _, _, ns in expected)
    for name, rank, ns in expected:
        # The same instant, measured from the earliest one (to float precision in µs).
        assert got[(name, rank)] == pytest.approx((ns - origin) / 1e3, abs=1e-3)
    # The earliest thing is rank 0's init broadcast, issued before its first step began.
    assert got[("broadcast s1", 0)] == 0.0 and got[("step 1", 0)] > 0
    assert sorted(expected, key=lambda x: x[2]) == sorted(expected, key=lambda x: got[(x[0], x[1])])
