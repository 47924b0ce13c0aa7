"""The SLURM recipe of docs/engines/srun.md, without SLURM: ``zeroscope serve -- srun ...``
hands the collector's environment to the command, and srun's default ``--export=ALL`` carries
it to every task. tests/scripts/srun_standin.py plays srun on one node (N tasks, srun's task
variables, srun's ``--export`` rules); each task maps ``SLURM_PROCID`` to torch's ``RANK`` as
the recipe does. The independent answer: every task's rank is in the trace with every step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attach_support import read_trace
from tests.distributed import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
SRUN = ROOT / "tests" / "scripts" / "srun_standin.py"
TRAIN = ROOT / "tests" / "scripts" / "agent_only_train.py"
STEPS = 3
TASK = (
    # the recipe's per-task line: SLURM's task ids as torch's rank variables
    "RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
    'MASTER_ADDR=127.0.0.1 MASTER_PORT={port} exec "{python}" "{train}" --steps {steps}'
)
SERVE = [sys.executable, "-m", "zeroscope", "serve", "--record", "t.zstrace", "--"]


def _serve_srun(tmp_path: Path, export: str) -> subprocess.CompletedProcess[str]:
    port = free_port()
    task = TASK.format(port=port, python=sys.executable, train=TRAIN, steps=STEPS)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run(
        [*SERVE, sys.executable, str(SRUN), "-n", "2", f"--export={export}", "bash", "-c", task],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_srun_task_reports_with_srun_default_export(tmp_path: Path) -> None:
    done = _serve_srun(tmp_path, "ALL")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trace = read_trace(tmp_path / "t.zstrace")
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
