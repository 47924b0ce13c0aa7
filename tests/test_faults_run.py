"""Tier 3 faults in a real 2-rank ``zeroscope run --headless`` (agent-only job on gloo):

- the trace's disk fills up (RLIMIT_FSIZE on zeroscope's process: every write past the limit
  fails with EFBIG, as on a full disk; CPython ignores SIGXFSZ): recording stops with an alert
  naming the last recorded step, training runs to the end with exit 0, and the trace replays
  up to that step;
- one rank is SIGKILLed mid-run: the job fails, the headless summary and the replayed trace
  both name the rank that died and the last step it completed, and every step before is kept.

- the collector SIGKILLed under the demo (bundled engine, ZeRO-2 fp16), then restarted: the
  losses are those of a run without zeroscope, the agents reconnect and the new collector
  records to the last step. (The agent helper's
  tests/test_agent_distributed.py::test_killing_the_collector_never_hurts_training_and_reporting_resumes
  does the same on a hand-written loop, comparing every loss bitwise.)
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.distributed import free_port
from tests.test_agent_distributed import last_step, start_collector
from zeroscope.collector.server import wait_for
from zeroscope.store.trace import TraceReader

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
    # What was committed replays: the trace reaches the step the alert names, each rank's
    # steps from 1 without a hole (how far each got depends on when its last batch of reports
    # arrived: steps this short leave every 0.5 s, agent/outbox.py).
    with TraceReader(tmp_path / "t.zstrace") as trace:
        assert [h.rank for h in trace.hellos()] == [0, 1]
        assert (trace.steps() or (0, 0))[1] == kept
        for rank in (0, 1):
            got = [m.step for m in trace.messages(ranks=[rank], kinds=["step"])]
            assert got == list(range(1, len(got) + 1))
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
        # Steps of real length: a report leaves as its step ends once the previous one left
        # 0.5 s before or more (agent/outbox.py); shorter steps leave in batches, so a killed
        # rank would lose its last ~0.5 s of steps, not just its last one.
        "--step-s",
        "0.55",
        cwd=tmp_path,
    )
    # The first failure decides: rank 1's death by SIGKILL (128 + 9), not torchrun's own 1.
    assert run.returncode == 137, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[-1] == "job exit code 137"
    assert "rank 1 failed first (exit code 137): killed by SIGKILL" in run.stderr.splitlines()
    died_lines = [ln for ln in lines if ln.startswith("rank r1 died without a word after step ")]
    assert len(died_lines) == 1, run.stdout[-3000:]
    (died,) = died_lines
    assert died.endswith(" (killed or crashed: no Bye)")
    # Its last report (step 7) may die with it, unsent in its socket's buffer: a SIGKILL
    # gives no chance to flush. What the view says is what arrived.
    last = int(died.split()[8])
    assert last in (6, 7)
    assert step_numbers(run.stdout) == list(range(1, 8))
    # Rank 0 saw its peer vanish (gloo: connection reset) and said so in its Bye, or torchrun
    # (polling its workers every 0.1 s) stopped it with SIGTERM first, and it said that.
    said = [ln for ln in lines if ln.startswith("rank 0 exited with code 1: RuntimeError: ")]
    stopped = "r0 stopped by SIGTERM" in lines
    assert len(said) + stopped == 1, lines
    assert all("{" not in ln for ln in said)  # a sentence, not a Python dict
    replay = zeroscope("replay", "--headless", "t.zstrace", cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert died in replay.stdout.splitlines()
    assert step_numbers(replay.stdout) == list(range(1, 8))
    with TraceReader(tmp_path / "t.zstrace") as trace:
        got = {r: [m.step for m in trace.messages(ranks=[r], kinds=["step"])] for r in (0, 1)}
        assert got == {0: list(range(1, 8)), 1: list(range(1, last + 1))}
        errors = [m for m in trace.messages(kinds=["event"]) if m.event == "error"]
        assert [e.rank for e in errors] == ([0] if said else [])


def train_gpt(env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    """The demo (bundled engine, ZeRO-2 fp16) on 2 gloo ranks under plain torchrun."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            str(free_port()),
            str(ROOT / "examples" / "train_gpt.py"),
            "--steps",
            "41",
            "--deepspeed_config",
            str(ROOT / "examples" / "ds_config_stage2.json"),
        ],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


@pytest.mark.slow
def test_the_demo_survives_its_collector_killed_and_restarted(tmp_path: Path) -> None:
    """The real engine: losses identical to a run without zeroscope; after the restart the
    agents reconnect and the new collector records through the last step."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ZEROSCOPE_")}
    base.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    reference = train_gpt(base, tmp_path)
    expected = reference.communicate(timeout=150)[0]
    assert reference.returncode == 0
    port = free_port()
    first, address = start_collector(port, tmp_path / "a.zst")
    second = None
    env = {**base, "ZEROSCOPE_COLLECTOR": address, "ZEROSCOPE_JOB_ID": "demo-kill"}
    job = train_gpt(env, tmp_path)
    try:
        assert wait_for(lambda: last_step(tmp_path / "a.zst") >= 5, 120)
        # The job is held (SIGSTOP: numerics untouched) while the collector is replaced, so
        # the new one is listening before the last steps, however slowly it starts on a loaded
        # machine; the agents then reconnect on their own (at the latest as they close).
        held = [psutil.Process(job.pid), *psutil.Process(job.pid).children(recursive=True)]
        for p in held:
            p.send_signal(signal.SIGSTOP)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        killed_at = last_step(tmp_path / "a.zst")
        second, _ = start_collector(port, tmp_path / "b.zst")  # returns once it listens
        for p in held:
            p.send_signal(signal.SIGCONT)
        out = job.communicate(timeout=150)[0]
        assert job.returncode == 0
        recorded = wait_for(lambda: last_step(tmp_path / "b.zst") == 41, 20)
        assert recorded, f"the new collector's last step: {last_step(tmp_path / 'b.zst')}"
    finally:
        for proc in (job, first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    losses = [ln for ln in out.splitlines() if ln.startswith("[train_gpt] step")]
    assert losses == [ln for ln in expected.splitlines() if ln.startswith("[train_gpt] step")]
    assert len(losses) == 3  # steps 0, 20, 40
    assert killed_at < 41
    with TraceReader(tmp_path / "b.zst") as trace:
        assert [h.rank for h in trace.hellos()] == [0, 1]  # re-announced to the new collector
        for rank in (0, 1):
            steps = [m.step for m in trace.messages(ranks=[rank], kinds=["step"])]
            assert steps[-1] == 41 and steps == list(range(steps[0], 42))
