"""``zeroscope run`` and ``zeroscope replay``: torchrun's argv, and the whole path end to end —
real torchrun ranks reporting through the agent, the collector recording, the headless lines,
and the trace replayed into the very same lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures import synthetic_run, write_trace
from zeroscope.cli import main
from zeroscope.run.launch import job_environment

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "agent_only_train.py"


def test_job_environment_names_the_collector_and_only_a_real_token() -> None:
    env = job_environment({"PATH": "/bin", "ZEROSCOPE_TOKEN": "stale"}, "tcp://127.0.0.1:5", "j1")
    assert env["ZEROSCOPE_COLLECTOR"] == "tcp://127.0.0.1:5" and env["ZEROSCOPE_JOB_ID"] == "j1"
    assert "ZEROSCOPE_TOKEN" not in env and env["PATH"] == "/bin"
    assert job_environment({}, "a", "j", "t")["ZEROSCOPE_TOKEN"] == "t"


def test_run_rejects_a_missing_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--headless", "no/such/train.py"]) == 2
    assert "no such training script: no/such/train.py" in capsys.readouterr().err


def test_run_says_how_when_the_script_given_is_python(capsys: pytest.CaptureFixture[str]) -> None:
    """``zeroscope run python train.py`` (the habit of ``python train.py``) names the fix."""
    assert main(["run", "--headless", "python", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such training script: python" in err[0]
    assert "`zeroscope run train.py ARGS`" in err[0]


def test_replay_headless_of_a_recorded_fixture(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "fx.zstrace"
    write_trace(trace, synthetic_run())
    assert main(["replay", "--headless", str(trace)]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [line for line in out if line.startswith("step ")]
    assert len(steps) == 40 and steps[20].split()[1] == "20"
    assert "slowest r3 (+5" in steps[25]  # ~55 ms more compute than the others (fixture)
    assert out[-1] == f"trace: {trace}"


def test_replay_names_a_bad_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.zstrace"
    bad.write_text("not sqlite")
    assert main(["replay", "--headless", str(bad)]) == 2
    assert "not a zeroscope trace" in capsys.readouterr().err


def _zeroscope(*argv: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "zeroscope", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _engine_ready() -> bool:
    try:
        from zeroscope.engine import api

        return callable(getattr(api, "initialize", None))
    except Exception:
        return False


DEMO = [
    str(ROOT / "examples" / "train_gpt.py"),
    "--deepspeed_config",
    str(ROOT / "examples" / "ds_config_stage2.json"),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("job", "memory"),
    [
        pytest.param([str(SCRIPT)], "P 16.6KB G 16.6KB O 33.3KB", id="agent-only"),
        pytest.param(
            DEMO,
            "P 220KB G 110KB O 661KB",  # 110k parameters: fp16 P, G and O sharded over 2 ranks
            id="demo",
            marks=pytest.mark.skipif(not _engine_ready(), reason="engine has no initialize()"),
        ),
    ],
)
def test_headless_run_records_a_trace_that_replays_to_the_same_lines(
    tmp_path: Path, job: list[str], memory: str
) -> None:
    run = _zeroscope(
        "run", "--nproc-per-node", "2", "--headless", *job, "--steps", "3", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # The job's own prints share stdout with zeroscope's lines, in whatever order they race.
    lines = [line for line in run.stdout.splitlines() if not line.startswith("[train_gpt]")]
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1", "2", "3"], run.stdout + run.stderr[-3000:]
    assert all("ranks 2" in line and memory in line for line in steps)
    (trace_line,) = [line for line in lines if line.startswith("trace: ")]
    trace = tmp_path / trace_line.removeprefix("trace: ")
    assert trace.parent == tmp_path / "runs" and trace.suffix == ".zstrace"  # the default path
    assert lines[-1] == "job exit code 0"

    replay = _zeroscope("replay", "--headless", str(trace), cwd=tmp_path)
    assert replay.returncode == 0, replay.stderr
    again = replay.stdout.splitlines()
    summary = lines[lines.index(steps[-1]) + 1 : lines.index(trace_line)]
    assert again[: len(steps)] == steps
    assert again[len(steps) : -1] == summary


@pytest.mark.slow
def test_the_jobs_failure_is_zeroscopes_exit_code(tmp_path: Path) -> None:
    run = _zeroscope(
        "run",
        "--nproc-per-node",
        "2",
        "--headless",
        "--record",
        "t.zstrace",
        str(SCRIPT),
        "--steps",
        "4",
        "--fail-at",
        "2",
        cwd=tmp_path,
    )
    assert run.returncode == 3, run.stderr[-3000:]  # the ranks' own sys.exit(3), not torchrun's 1
    assert run.stdout.splitlines()[-1] == "job exit code 3"
    assert "(exit code 3): exited with code 3 without a traceback" in run.stderr  # a diagnostic
    assert (tmp_path / "t.zstrace").is_file()
    steps = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1", "2"]  # the third step never ended
