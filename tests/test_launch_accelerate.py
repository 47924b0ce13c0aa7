"""``accelerate launch`` under zeroscope, with a DeepSpeed plugin (ZeRO-2) and an FSDP plugin
(FSDP2), 2 CPU ranks: ``zeroscope serve -- accelerate launch ...`` leaves the script's output as
it is without zeroscope (the reference: the same ``accelerate launch`` alone) and records both
ranks' every step. accelerate starts the ranks itself (torch's elastic agent, in-process), so the
collector's environment reaches them through the command's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attach_support import read_trace, run_job
from tests.distributed import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "accelerate_train.py"
STEPS = 4
PLUGINS = {
    # a ds_config file, as accelerate's DeepSpeed examples pass one (accelerate fills its "auto"s)
    "deepspeed": ["--use_deepspeed", "--deepspeed_config_file", "ds.json"],
    "fsdp": ["--use_fsdp", "--fsdp_version", "2", "--mixed_precision", "no"],
}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    return env


DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 2},
}


def _launch(plugin: str) -> list[str]:
    port = str(free_port())
    return [
        *(sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2"),
        *("--num_machines", "1", "--main_process_port", port, *PLUGINS[plugin]),
        *(str(SCRIPT), "--steps", str(STEPS)),
    ]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # A finished run ended by torch's gloo teardown abort (and only that) is run again
    # (tests/attach_support.py).
    done = run_job(argv, _env(), 900, cwd=cwd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _losses(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("LOSS "))


@pytest.mark.parametrize("plugin", list(PLUGINS))
def test_accelerate_launch_under_serve(plugin: str, tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(DS_CONFIG))
    plain = _run(_launch(plugin), tmp_path)
    serve = [sys.executable, "-m", "zeroscope", "serve", "--record", "t.zstrace", "--"]
    ours = _run([*serve, *_launch(plugin)], tmp_path)
    assert len(_losses(plain.stdout)) == 2 * STEPS
    assert _losses(ours.stdout) == _losses(plain.stdout)
    trace = read_trace(tmp_path / "t.zstrace")
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
    # The header names the engine accelerate actually built (the script says which).
    wrapped = next(ln.split()[1] for ln in ours.stdout.splitlines() if ln.startswith("WRAPPED "))
    expected = {"fsdp2": "fsdp2", "ddp": "ddp", "none": "torch"}[wrapped]
    engine = {h.engine for r in (0, 1) for h in trace[r].hellos}
    if plugin == "deepspeed":  # the DeepSpeed engine is not a torch wrapper the script can see
        assert engine and all("deepspeed" in e for e in engine), engine
    else:
        assert engine == {expected}, (wrapped, engine)
