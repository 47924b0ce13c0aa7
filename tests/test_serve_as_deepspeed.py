"""``zeroscope serve --as-deepspeed -- COMMAND``: the command's ``import deepspeed`` gets the
bundled engine (as under ``zeroscope run --as-deepspeed``) while the real DeepSpeed stays
installed; without the flag it gets the real one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVE = [sys.executable, "-m", "zeroscope", "serve", "--no-record"]
PROBE = "import deepspeed; print('DEEPSPEED', deepspeed.__name__, deepspeed.__version__)"


@pytest.mark.parametrize(
    ("flags", "module"),
    [(["--as-deepspeed"], "zeroscope.engine.deepspeed"), ([], "deepspeed")],
)
def test_serve_as_deepspeed_aliases_the_commands_import(
    flags: list[str], module: str, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    done = subprocess.run(
        [*SERVE, *flags, "--", sys.executable, "-c", PROBE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("DEEPSPEED "))
    assert line.split()[1] == module
