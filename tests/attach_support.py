"""Running unmodified training scripts twice, under ``zeroscope run --headless --record`` and
under bare torchrun, and reading back what zeroscope recorded (the attach tests' harness)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zeroscope.agent.schema import Event, Hello, StepReport, decode
from zeroscope.store.trace import TraceReader

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "tests" / "jobs"
FP16_ON_CPU = JOBS / "fp16_on_cpu"
"""A sitecustomize letting DeepSpeed's CPU accelerator accept fp16 (see the file)."""


def job_env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    paths = [str(ROOT)] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("ZEROSCOPE_COLLECTOR", None)
    return env


TEARDOWN_ABORT = "terminate called without an active exception"
"""What torch 2.13's gloo prints when it aborts a rank at interpreter exit: a worker thread lets
go of a finished collective's tensors after the interpreter began finalizing and cannot take
the GIL (runLoop -> ~AsyncAllreduceWork -> decref_pyobject -> take_gil -> pthread_exit ->
std::terminate). It comes after the job did all its work, with or without zeroscope. The jobs
that end through tests/jobs/teardown.py are past it; the rerun below stays for the others (the
DeepSpeed jobs leave their group to the interpreter) and for a torch that frees works otherwise."""


TEARDOWN_RUNS = 3
"""How many times :func:`run_job` runs a job that only hit :data:`TEARDOWN_ABORT`. The abort
strikes a run at random (a race with the interpreter's exit); one rerun was not enough: a CI
run of a clean clone saw a DeepSpeed reference job abort twice in a row."""


def run_job(
    argv: list[str],
    env: dict[str, str],
    timeout: float,
    trace: Path | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a job; a run that failed only of torch's teardown abort (:data:`TEARDOWN_ABORT` in
    its output, or in the job's log next to ``trace`` under zeroscope) is run again, up to
    :data:`TEARDOWN_RUNS` runs in all: any other failure, or the abort in every run, is returned
    as it is."""
    log = trace.with_suffix(".log") if trace is not None else None
    for run in range(1, TEARDOWN_RUNS + 1):
        if run > 1:
            print(f"torch's gloo teardown abort: run {run} of {' '.join(argv[2:6])}")
        if run > 1 and trace is not None and log is not None:  # zeroscope never overwrites a trace
            for name in (trace.name, f"{trace.name}-wal", f"{trace.name}-shm", log.name):
                (trace.parent / name).unlink(missing_ok=True)
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
        said = done.stdout + done.stderr + (log.read_text() if log and log.exists() else "")
        if done.returncode == 0 or TEARDOWN_ABORT not in said:
            return done
    return done


def run_plain(script: Path, args: list[str], env: dict[str, str], timeout: float) -> None:
    """The script under torchrun alone: the reference run."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)]
    done = run_job([*argv, *args], env, timeout)
    assert done.returncode == 0, done.stderr[-4000:]


def run_zeroscope(
    script: Path, args: list[str], env: dict[str, str], trace: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "zeroscope", "run", "--headless", "--nproc-per-node", "2"]
    argv += ["--record", str(trace), str(script), *args]
    done = run_job(argv, env, timeout, trace)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@dataclass
class RankTrace:
    """What one rank reported, in order."""

    hellos: list[Hello] = field(default_factory=list)
    steps: list[StepReport] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def read_trace(path: Path) -> dict[int, RankTrace]:
    ranks: dict[int, RankTrace] = {}
    with sqlite3.connect(path) as conn:  # every Hello in arrival order (a sweep sends several)
        rows = conn.execute("SELECT payload FROM messages WHERE kind = 'hello' ORDER BY seq")
        for (payload,) in rows.fetchall():
            hello = decode(payload)
            assert isinstance(hello, Hello)
            rank = ranks.setdefault(hello.rank, RankTrace())
            if not rank.hellos or rank.hellos[-1] != hello:
                rank.hellos.append(hello)
    with TraceReader(path) as reader:
        for message in reader.messages():
            rank = ranks.setdefault(getattr(message, "rank", -1), RankTrace())
            if isinstance(message, StepReport):
                rank.steps.append(message)
            elif isinstance(message, Event):
                rank.events.append(message)
    return ranks


def write_configs(folder: Path, configs: dict[str, dict[str, Any]]) -> list[str]:
    """Each ds_config as ``folder/<name>.json``; their paths, in order (a sweep script's
    ``--configs``)."""
    paths = []
    for name, config in configs.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(config))
        paths.append(str(path))
    return paths


def read_outputs(prefix: Path) -> list[dict[str, Any]]:
    return [json.loads(Path(f"{prefix}.{rank}").read_text()) for rank in range(2)]


def plain_and_watched(
    script: Path, steps: int, tmp_path: Path, timeout: float = 300, extra: tuple[str, ...] = ()
) -> tuple[dict[int, RankTrace], list[dict[str, Any]], list[dict[str, Any]]]:
    """A job that writes its own figures to ``--out``.RANK, run under bare torchrun and under
    ``zeroscope run`` (``extra``: more of the job's arguments): (the trace, each rank's figures
    alone, each rank's figures watched)."""
    env = job_env()
    args = ["--steps", str(steps), *extra]
    run_plain(script, [*args, "--out", str(tmp_path / "plain")], env, timeout)
    run_zeroscope(
        script, [*args, "--out", str(tmp_path / "zs")], env, tmp_path / "t.zstrace", timeout
    )
    trace = read_trace(tmp_path / "t.zstrace")
    return trace, read_outputs(tmp_path / "plain"), read_outputs(tmp_path / "zs")


def segments(steps: list[StepReport], sizes: list[int]) -> list[list[StepReport]]:
    """Split a rank's consecutive StepReports into the runs of a sweep script."""
    assert [s.step for s in steps] == list(range(1, sum(sizes) + 1))
    out, start = [], 0
    for n in sizes:
        out.append(steps[start : start + n])
        start += n
    return out


def bytes_by_op(report: StepReport, op: str) -> list[int]:
    return [c.nbytes for c in report.collectives if c.op == op]


def assert_clocks_honest(step: StepReport) -> None:
    """Every collective of a CPU (gloo) step says how it was timed, and only a measurement
    carries a figure: no device clock without CUDA; ``none`` (no clock saw it end) has no
    duration and no measured exposed time (shown NA); ``host`` has a duration that ended by its
    step's end (it may have begun before the step: the Trainer's gathers between steps) and,
    where its wait was measured, an exposed time within that duration."""
    for c in step.collectives:
        assert c.clock in ("host", "none"), (c.op, c.label, c.clock)
        if c.clock == "none":
            assert c.duration_s == 0.0 and not c.exposed_measured, (c.op, c.label)
        else:
            assert c.duration_s > 0.0, (c.op, c.label)
            end = c.start_s + c.duration_s
            assert end <= step.duration_s + 1e-6, (c.op, c.label, c.start_s, c.duration_s)
            if c.exposed_measured:
                assert 0.0 <= c.exposed_s <= c.duration_s, (c.op, c.label, c.exposed_s)
