"""zeroscope's own lines and the job's lines on one stdout (``zeroscope run --headless``, real
torchrun and gloo ranks, stdout and stderr one pipe as on a terminal): every step line starts a
line of its own, whatever the job left unfinished when it came, and no line of the job is cut.

The job (tests/scripts/agent_only_train.py ``--chatter``) pauses after each step with an
unfinished ``LOSS`` line (odd steps) or a progress bar ended by ``\\r`` (even steps) on stdout,
just when that step's report reaches zeroscope. Bytes are read as they are, split at ``\\n``
only, as ``grep`` reads them (Python's universal newlines would split at ``\\r`` too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAINING = ROOT / "tests" / "scripts" / "agent_only_train.py"
pytestmark = pytest.mark.slow

STEPS = 4


def test_step_lines_start_a_line_and_never_cut_the_jobs_lines(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "zeroscope", "run", "--headless", "--nproc-per-node", "2",
         str(TRAINING), "--steps", str(STEPS), "--chatter", "0.8"],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=240,
    )  # fmt: skip
    out = run.stdout
    assert run.returncode == 0, out.decode(errors="replace")[-3000:]
    lines = out.split(b"\n")
    step_lines = [ln for ln in lines if re.search(rb"step +\d+  time", ln)]
    assert step_lines and all(ln.startswith(b"step ") for ln in step_lines), step_lines
    assert [int(ln.split()[1]) for ln in step_lines] == list(range(1, STEPS + 1))
    # The job's own output, whole and in order: each LOSS line reaches its own line end, each
    # progress bar its '\r' (what follows a bar is the job's next line, or a line zeroscope
    # began after it).
    found = re.findall(rb"LOSS \d+\.\d{4}\n|progress \d/\d\r", out)
    assert [f[:4] for f in found] == [b"LOSS", b"prog"] * (STEPS // 2), found
    assert lines[-2:] == [b"job exit code 0", b""]
