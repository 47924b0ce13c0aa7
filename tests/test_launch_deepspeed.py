"""``zeroscope run`` with the DeepSpeed launcher's flags runs the job the way ``deepspeed`` does
(the same script output: each rank's losses and the ``--local_rank`` the launcher passes) and
records every rank's every step. The reference is DeepSpeed's own launcher on the same script,
2 CPU ranks (``DS_ACCELERATOR=cpu``, gloo)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attach_support import read_trace

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "ds_launcher_train.py"
STEPS = 4
CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
}


ZEROSCOPE_RUN = [sys.executable, "-m", "zeroscope", "run", "--headless", "--record", "t.zstrace"]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    return env


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _losses(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("LOSS "))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("ds-launcher")
    config = tmp / "ds.json"
    config.write_text(json.dumps(CONFIG))
    script_args = [str(SCRIPT), "--steps", str(STEPS), "--deepspeed", "--deepspeed_config"]
    script_args.append(str(config))
    out = {}
    # `deepspeed --num_gpus 2 train.py ...`: the `deepspeed` command is this module's main().
    launcher = [sys.executable, "-m", "deepspeed.launcher.runner"]
    for name, argv in [
        ("deepspeed", [*launcher, "--num_gpus", "2", "--master_port", _free_port()]),
        (
            "zeroscope",
            [*ZEROSCOPE_RUN, "--num_gpus", "2", "--master_port", _free_port()],
        ),
    ]:
        out[name] = subprocess.run(
            [*argv, *script_args],
            cwd=tmp,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert out[name].returncode == 0, out[name].stdout[-3000:] + out[name].stderr[-3000:]
    out["trace"] = tmp / "t.zstrace"  # type: ignore[assignment]
    return out


def test_the_script_prints_what_it_prints_under_deepspeed(runs: dict) -> None:
    ours, theirs = _losses(runs["zeroscope"].stdout), _losses(runs["deepspeed"].stdout)
    assert len(theirs) == 2 * STEPS
    assert ours == theirs, runs["zeroscope"].stdout[-4000:]
    # DeepSpeed's launcher ran the ranks: each got --local_rank=N, as under `deepspeed`.
    assert {line.split("local_rank_arg ")[1] for line in ours} == {
        "0 LOCAL_RANK 0",
        "1 LOCAL_RANK 1",
    }


def test_the_trace_has_both_ranks_and_every_step(runs: dict) -> None:
    trace = read_trace(runs["trace"])
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
    lines = [ln for ln in runs["zeroscope"].stdout.splitlines() if ln.startswith("step ")]
    assert len(lines) == STEPS
    assert "job exit code 0" in runs["zeroscope"].stdout
