"""DeepSpeed 0.19.8 is the oracle for the pipeline API: tests/scripts/pipe_tutorial.py (LayerSpecs,
a lambda layer, ``train_batch()`` fed by ``training_data``, then ``eval_batch()`` on held-out
micro-batches; ZeRO-0, 2 stages on 2 gloo ranks)
runs under real DeepSpeed's PipelineModule/PipelineEngine on CPU, and again with only its two
deepspeed imports rewritten to the bundled engine's DeepSpeed surface. The stage boundaries and every step's loss
and the evaluation loss must be equal (same partition, same data order, same averaging over
micro-batches).

Both are also checked against one process training the same layers: the script seeds once and
``partition_method="parameters"`` builds every layer once to count its parameters (both
engines, as DeepSpeed's ``_count_layer_params``) before each stage builds its own, so stage k's
first layer is drawn right after those counting builds; the reference replays exactly that and
trains the same global batches (8 samples per step, in order: the pipeline's loader does not
shuffle) with torch's AdamW. At four stages (4 ranks, pp4 x dp1; the soak tier: four torchrun
launches, minutes here) the same script runs on both engines at ZeRO 0 and 1 (DeepSpeed refuses
2 and 3 with a pipeline) and on the engine alone at ZeRO 2 and 3, each against the reference.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.attach_support import run_job

SCRIPT = Path(__file__).parent / "scripts" / "pipe_tutorial.py"
REWRITES = {
    "import deepspeed\n": "import zeroscope.engine as deepspeed\n",
    "from deepspeed.pipe import": "from zeroscope.engine.deepspeed.pipe import",
}


def _torchrun(script: Path, out: Path, ranks: int = 2, *args: str) -> dict:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("ZEROSCOPE_COLLECTOR", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    cmd += ["--master-port", str(_free_port()), str(script), "--steps", "4", "--out", str(out)]
    proc = run_job(cmd + list(args), env, 900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(out.read_text()))


def _ported(tmp_path: Path) -> Path:
    """The script with only its two deepspeed imports rewritten to the bundled engine."""
    source = SCRIPT.read_text()
    ported = source
    for old, new in REWRITES.items():
        assert old in ported
        ported = ported.replace(old, new)
    changed = [a for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert len(changed) == 2 and all("import" in line for line in changed)
    mine = tmp_path / "pipe_tutorial_zeroscope.py"
    mine.write_text(ported)
    return mine


def _builders() -> list[Callable[[], nn.Module] | None]:
    """The script's layers in order (None: its lambda, no parameters, nothing drawn)."""
    return [
        lambda: nn.Linear(12, 32),
        nn.ReLU,
        lambda: nn.Linear(32, 32),
        None,
        lambda: nn.Linear(32, 16),
        nn.ReLU,
        lambda: nn.Linear(16, 5),
    ]


class _Tanh(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


def reference_losses(parts: list[int], steps: int, seed: int = 1138) -> list[float]:
    """One process, the script's layers as each stage of ``parts`` built them and its global
    batches: the mean loss of each step."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from pipe_tutorial import dataset
    finally:
        sys.path.remove(str(SCRIPT.parent))
    builders = _builders()
    modules: list[nn.Module] = []
    for start, stop in itertools.pairwise(parts):
        torch.manual_seed(seed)
        for build in builders:  # partition_method="parameters" counting every layer
            if build is not None:
                build()
        modules += [_Tanh() if b is None else b() for b in builders[start:stop]]
    model = nn.Sequential(*modules)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    x, y = dataset().tensors
    losses = []
    for step in range(steps):
        opt.zero_grad()
        total = 0.0
        for at in range(8 * step, 8 * step + 8, 2):  # four micro-batches of 2
            loss = nn.functional.cross_entropy(model(x[at : at + 2]), y[at : at + 2])
            (loss / 4).backward()
            total += loss.item() / 4
        opt.step()
        losses.append(total)
    return losses


def _free_port() -> int:
    from tests.distributed import free_port

    return free_port()


@pytest.mark.slow
def test_tutorial_script_matches_deepspeed_with_only_imports_changed(tmp_path: Path) -> None:
    ours = _torchrun(_ported(tmp_path), tmp_path / "ours.json")
    theirs = _torchrun(SCRIPT, tmp_path / "deepspeed.json")
    assert ours["parts"] == theirs["parts"]
    assert ours["losses"] == pytest.approx(theirs["losses"], rel=0, abs=1e-6)
    assert ours["eval"] == pytest.approx(theirs["eval"], rel=0, abs=1e-6)  # eval_batch()
    assert theirs["losses"][0] != theirs["losses"][-1]  # it trained
    expected = reference_losses(ours["parts"], 4)
    assert ours["losses"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.soak
@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_tutorial_at_four_stages_matches_deepspeed_and_one_process(
    tmp_path: Path, zero: int
) -> None:
    """pp4 x dp1: each stage's layers drawn after the counting builds, four micro-batches
    through four stages per step, four steps; DeepSpeed 0.19.8 runs it at ZeRO 0 and 1 only."""
    args = ("--stages", "4", "--zero", str(zero))
    ours = _torchrun(_ported(tmp_path), tmp_path / "ours.json", 4, *args)
    assert ours["parts"] == [0, 2, 4, 6, 7]
    assert ours["losses"] == pytest.approx(reference_losses(ours["parts"], 4), rel=1e-6)
    if zero < 2:
        theirs = _torchrun(SCRIPT, tmp_path / "deepspeed.json", 4, *args)
        assert ours["parts"] == theirs["parts"]
        assert ours["losses"] == pytest.approx(theirs["losses"], rel=0, abs=1e-6)
        assert ours["eval"] == pytest.approx(theirs["eval"], rel=0, abs=1e-6)
