"""DeepSpeed 0.19.8 is the oracle for the pipeline API: tests/scripts/pipe_tutorial.py (LayerSpecs,
a lambda layer, ``train_batch()`` fed by ``training_data``, then ``eval_batch()`` on held-out
micro-batches; ZeRO-0, 2 stages on 2 gloo ranks)
runs under real DeepSpeed's PipelineModule/PipelineEngine on CPU, and again with only its two
deepspeed imports rewritten to the bundled engine's DeepSpeed surface. The stage boundaries and every step's loss
and the evaluation loss must be equal (same partition, same data order, same averaging over
micro-batches).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "pipe_tutorial.py"
REWRITES = {
    "import deepspeed\n": "import zeroscope.engine as deepspeed\n",
    "from deepspeed.pipe import": "from zeroscope.engine.deepspeed.pipe import",
}


def _torchrun(script: Path, out: Path) -> dict:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("ZEROSCOPE_COLLECTOR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-port", str(_free_port()), str(script), "--steps", "4", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(out.read_text()))


def _free_port() -> int:
    from tests.distributed import free_port

    return free_port()


@pytest.mark.slow
def test_tutorial_script_matches_deepspeed_with_only_imports_changed(tmp_path: Path) -> None:
    source = SCRIPT.read_text()
    ported = source
    for old, new in REWRITES.items():
        assert old in ported
        ported = ported.replace(old, new)
    changed = [a for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert len(changed) == 2 and all("import" in line for line in changed)
    mine = tmp_path / "pipe_tutorial_zeroscope.py"
    mine.write_text(ported)
    ours = _torchrun(mine, tmp_path / "ours.json")
    theirs = _torchrun(SCRIPT, tmp_path / "deepspeed.json")
    assert ours["parts"] == theirs["parts"]
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=0, abs=1e-6)
    assert ours["eval"] == pytest.approx(theirs["eval"], rel=0, abs=1e-6)  # eval_batch()
    assert theirs["losses"][0] != theirs["losses"][-1]  # it trained
