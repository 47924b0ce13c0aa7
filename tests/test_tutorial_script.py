"""A DeepSpeed tutorial-style script (tests/scripts/ds_tutorial.py: argparse +
``add_config_arguments``, ``init_distributed``, ``initialize(args=..., training_data=...)``,
``RepeatingLoader``, ``save_checkpoint(client_state=...)``, ``load_checkpoint``) runs on the
bundled engine with only its import changed, and unchanged under ``zeroscope run
--as-deepspeed`` (the real package installed: the alias must win), with the losses, learning
rate, gradient norm, step and sample counters of the same script on DeepSpeed 0.19.8 itself
(2 gloo ranks, ZeRO-2, fp32, gradient accumulation 2, clipping, WarmupDecayLR).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.attach_support import run_job

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "scripts" / "ds_tutorial.py"
CONFIG = ROOT / "tests" / "scripts" / "ds_tutorial.json"
ENV = {"OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # The script destroys its process group (torch's gloo teardown abort at exit, which can end
    # a finished run: tests/attach_support.py); an abort would still be run again, once.
    done = run_job(argv, {**os.environ, **ENV}, 600, cwd=cwd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _script_args(folder: Path) -> list[str]:
    return [
        "--deepspeed",
        "--deepspeed_config",
        str(CONFIG),
        "--checkpoint",
        str(folder / "ckpt"),
        "--out",
        str(folder / "result.json"),
    ]


def _torchrun(script: Path, folder: Path) -> dict[str, Any]:
    _run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(script),
            *_script_args(folder),
        ],
        cwd=folder,
    )
    return json.loads((folder / "result.json").read_text())


@pytest.fixture(scope="module")
def deepspeed_result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _torchrun(SCRIPT, tmp_path_factory.mktemp("deepspeed"))


def _matches(ours: dict[str, Any], ref: dict[str, Any]) -> None:
    for key in ("first", "after", "resumed"):
        assert len(ours[key]) == len(ref[key])
        for a, b in zip(ours[key], ref[key], strict=True):
            assert math.isclose(a, b, rel_tol=1e-5), (key, ours[key], ref[key])
    assert ours["resumed"] == ours["after"]  # the checkpoint restored everything
    for a, b in zip(ours["lr"], ref["lr"], strict=True):
        assert math.isclose(a, b, rel_tol=1e-12)
    assert math.isclose(ours["grad_norm"], ref["grad_norm"], rel_tol=1e-5)
    for key in ("client_state", "loaded", "global_steps", "global_samples", "batches_per_epoch"):
        assert ours[key] == ref[key], key
    assert ours["world"] == ref["world"] == 2


def test_only_the_import_changed(deepspeed_result: dict[str, Any], tmp_path: Path) -> None:
    text = SCRIPT.read_text()
    assert text.count("import deepspeed\n") == 1 and "from deepspeed" not in text
    ported = tmp_path / "ported.py"
    ported.write_text(text.replace("import deepspeed\n", "import zeroscope.engine as deepspeed\n"))
    _matches(_torchrun(ported, tmp_path), deepspeed_result)


def test_unchanged_under_as_deepspeed(deepspeed_result: dict[str, Any], tmp_path: Path) -> None:
    done = _run(
        [
            sys.executable,
            "-m",
            "zeroscope",
            "run",
            "--headless",
            "--as-deepspeed",
            "--nproc-per-node",
            "2",
            "--record",
            str(tmp_path / "run.zstrace"),
            str(SCRIPT),
            *_script_args(tmp_path),
        ],
        cwd=tmp_path,
    )
    _matches(json.loads((tmp_path / "result.json").read_text()), deepspeed_result)
    # the engine reported to the collector: 7 optimizer steps, and the ignored keys once
    assert "job exit code 0" in done.stdout
    # zeroscope's attach bootstrap loads too: it stands down for the engine reporting itself,
    # so each step is counted once and the engine is not mistaken for a DeepSpeed it attached
    assert re.search(r"^job \S+: 7 steps on 2 ranks$", done.stdout, re.M), done.stdout[-2000:]
    assert done.stderr.count("round_robin_gradients: accepted and ignored") == 1
