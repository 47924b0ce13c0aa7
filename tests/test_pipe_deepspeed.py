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


@pytest.fixture(scope="module")
def deepspeed_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tutorial under real DeepSpeed, bare torchrun (two tests read it)."""
    return _torchrun(SCRIPT, tmp_path_factory.mktemp("deepspeed") / "deepspeed.json")


@pytest.mark.slow
def test_tutorial_script_matches_deepspeed_with_only_imports_changed(
    tmp_path: Path, deepspeed_run: dict
) -> None:
    ours = _torchrun(_ported(tmp_path), tmp_path / "ours.json")
    theirs = deepspeed_run
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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_under_the_attach_deepspeeds_pipeline_steps_are_its_train_batches(
    tmp_path: Path, deepspeed_run: dict
) -> None:
    """The same script under ``zeroscope run``: ``train_batch()`` runs a whole step, its
    optimizer through the schedule's own instruction, never ``engine.step()``, where the attach
    ended DeepSpeed's steps, and such a job reported no step at all ("2 ranks reported, no step
    completed"; agent/attach/deepspeed_pipe.py). The oracle is the script: the losses
    ``train_batch()`` returned (bitwise those of the bare run), its 8 samples a step (2 per
    micro-batch x 4, one replica), and Adam's state, two fp32 moments per parameter element."""
    from tests.attach_support import job_env, read_trace, run_zeroscope

    args = ["--steps", "4", "--out", str(tmp_path / "zs.json")]
    run_zeroscope(SCRIPT, args, job_env(), tmp_path / "t.zstrace", 600)
    job = json.loads((tmp_path / "zs.json").read_text())
    assert job["losses"] == deepspeed_run["losses"]  # bitwise: the attach changed nothing
    trace = read_trace(tmp_path / "t.zstrace")
    for rank in range(2):
        steps = trace[rank].steps
        assert [s.step for s in steps] == [1, 2, 3, 4]  # eval_batch() is no step
        for report, loss in zip(steps, job["losses"], strict=True):
            # train_batch()'s own loss on every stage (DeepSpeed broadcasts it from the last).
            assert report.loss == pytest.approx(loss, rel=1e-6)
            assert report.samples == (8 if rank == 0 else 0)  # once, on the first stage
            p = report.phases
            assert p.forward and p.backward and p.optimizer, (rank, report.step, p)
            m = report.memory
            assert m.params and m.grads == m.params  # ZeRO-0: whole fp32 gradients
            # AdamW's exp_avg and exp_avg_sq, fp32, beside a 4-byte step per parameter tensor.
            assert 2 * m.params <= m.optim < 2 * m.params + 4 * 64, m
    assert trace[0].hellos[-1].engine == "deepspeed"
    # Each rank's stage from DeepSpeed's process grid (two stages, one replica, the script's
    # four micro-batches a step): each stage is judged against its own replicas, not the other
    # stage (agent/attach/pipeline_layout.py).
    for rank in range(2):
        layout = trace[rank].hellos[-1].parallel
        assert layout is not None
        assert (layout.pp, layout.pp_size, layout.stages, layout.num_stages) == (rank, 2, [rank], 2)
        assert (layout.dp, layout.dp_size, layout.tp, layout.tp_size) == (0, 1, 0, 1)
        assert layout.microbatches == 4
