"""Tier 3 faults in a real 2-rank ``zeroscope run --headless`` (agent-only job on gloo):

- the trace's disk fills up (RLIMIT_FSIZE on zeroscope's process: every write past the limit
  fails with EFBIG, as on a full disk; CPython ignores SIGXFSZ): recording stops with an alert
  naming the last recorded step, training runs to the end with exit 0, and the trace replays
  up to that step;
- one rank is SIGKILLed mid-run: the job fails, the headless summary and the replayed trace
  both name the rank that died and the last step it completed, and every step before is kept.

(The collector killed and restarted under a live 2-rank job is
tests/test_agent_distributed.py::test_killing_the_collector_never_hurts_training_and_reporting_resumes.)
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from zeroscope.trace import TraceReader

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "agent_only_train.py"


def zeroscope(
    *argv: str, cwd: Path, fsize: int | None = None, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")

    def limit() -> None:
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return subprocess.run(
        [sys.executable, "-m", "zeroscope", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
    )


def step_numbers(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]


@pytest.mark.slow
def test_a_full_disk_stops_recording_with_an_alert_and_training_goes_on(tmp_path: Path) -> None:
    steps = 300  # a few seconds: recording fills the limit in the middle of the run
    run = zeroscope(
        "run",
        "--headless",
        "--nproc-per-node",
        "2",
        "--record",
        "t.zstrace",
        str(SCRIPT),
        "--steps",
        str(steps),
        cwd=tmp_path,
        fsize=200_000,  # room for the schema and about a hundred steps
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert step_numbers(run.stdout) == list(range(1, steps + 1))  # the live view went on
    (alert,) = [ln for ln in run.stdout.splitlines() if "recording stopped" in ln]
    assert alert.startswith("alert: recording stopped after step ")
    assert "trace write failed" in alert and "the run goes on" in alert
    kept = int(alert.removeprefix("alert: recording stopped after step ").split(":")[0])
    assert 0 <= kept < steps  # 0: only the ranks' start-up heartbeats were committed
    assert "ranks exited cleanly" in run.stdout
    # What was committed replays: the trace reaches the step the alert names, every step
    # before it complete on both ranks.
    with TraceReader(tmp_path / "t.zstrace") as trace:
        assert [h.rank for h in trace.hellos()] == [0, 1]
        assert (trace.steps() or (0, 0))[1] == kept
        for rank in (0, 1):
            got = [m.step for m in trace.messages(ranks=[rank], kinds=["step"])]
            assert got == list(range(1, len(got) + 1)) and len(got) >= kept - 1
    replay = zeroscope("replay", "--headless", "t.zstrace", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert step_numbers(replay.stdout)[: kept - 1] == list(range(1, kept))


@pytest.mark.slow
def test_a_killed_rank_is_named_with_its_last_step_live_and_in_the_trace(tmp_path: Path) -> None:
    run = zeroscope(
        "run",
        "--headless",
        "--nproc-per-node",
        "2",
        "--record",
        "t.zstrace",
        str(SCRIPT),
        "--steps",
        "20",
        "--kill-at",
        "7",  # 0-based loop index: rank 1 completes steps 1..7 and dies in step 8
        "--kill-rank",
        "1",
        cwd=tmp_path,
    )
    assert run.returncode != 0
    lines = run.stdout.splitlines()
    assert lines[-1] == f"job exit code {run.returncode}"
    (died,) = [ln for ln in lines if ln.startswith("rank r1 died without a word after step ")]
    assert died.endswith(" (killed or crashed: no Bye)")
    # Its last report (step 7) may die with it, unsent in its socket's buffer: a SIGKILL
    # gives no chance to flush. What the view says is what arrived.
    last = int(died.split()[8])
    assert last in (6, 7)
    assert step_numbers(run.stdout) == list(range(1, 8))
    # Rank 0 saw its peer vanish (gloo: connection reset) and said so in its Bye.
    assert "ranks exited with errors: {0: 1}" in lines
    replay = zeroscope("replay", "--headless", "t.zstrace", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert died in replay.stdout.splitlines()
    assert step_numbers(replay.stdout) == list(range(1, 8))
    with TraceReader(tmp_path / "t.zstrace") as trace:
        got = {r: [m.step for m in trace.messages(ranks=[r], kinds=["step"])] for r in (0, 1)}
        assert got == {0: list(range(1, 8)), 1: list(range(1, last + 1))}
        errors = [m for m in trace.messages(kinds=["event"]) if m.event == "error"]
        assert [e.rank for e in errors] == [0]
