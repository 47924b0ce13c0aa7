"""LLaMA-Factory under zeroscope: ``zeroscope run --nproc-per-node 2 -m llamafactory.launcher
cfg.yaml`` (the module ``llamafactory-cli train`` itself hands to torchrun) on a tiny Llama, 2 CPU
ranks, with a ZeRO-2 config like LLaMA-Factory's example (its ZeRO-3 one cannot run on CPU
ranks with or without zeroscope: docs/engines/llama-factory.md says why). The reference is plain
``llamafactory-cli train cfg.yaml`` (``FORCE_TORCHRUN=1 NPROC_PER_NODE=2``) on the same inputs:
the job's output (its per-step losses in ``trainer_log.jsonl`` and the trained weights it
saves) is the same, and the trace has both ranks and every step.

Skipped only when LLaMA-Factory cannot be installed (tests/llama_factory_support.py says how it
is installed without moving torch, transformers or DeepSpeed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.attach_support import read_trace
from tests.distributed import free_port
from tests.llama_factory_support import build_inputs, environment, interpreter, sft_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parent.parent
STEPS = 3


def _free_port() -> str:
    return str(free_port())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, str]]:
    cache = Path(tmp_path_factory.getbasetemp()).parent / "llamafactory-cache"
    python, why = interpreter(cache)
    if python is None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("llama-factory")
    build_inputs(tmp)
    return python, tmp, environment(tmp, python, ROOT)


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _losses(output_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(ln) for ln in (output_dir / "trainer_log.jsonl").read_text().splitlines()]
    return [(r["current_steps"], r["loss"]) for r in rows if "loss" in r]


@pytest.mark.parametrize("stage", [2])
def test_llama_factory_under_zeroscope_run(stage: int, setup: tuple) -> None:
    python, tmp, env = setup
    work = tmp / f"z{stage}"
    work.mkdir()
    for name in ("plain", "zeroscope"):
        (work / f"{name}.yaml").write_text(sft_yaml(tmp, stage, work / f"out-{name}", STEPS))
    plain_env = dict(env, FORCE_TORCHRUN="1", NPROC_PER_NODE="2", MASTER_PORT=_free_port())
    _run([python, "-m", "llamafactory.cli", "train", "plain.yaml"], plain_env, work)
    zeroscope = [python, "-m", "zeroscope", "run", "--headless", "--record", "t.zstrace"]
    zeroscope += ["--nproc-per-node", "2", "--master_port", _free_port()]
    ours = _run([*zeroscope, "-m", "llamafactory.launcher", "zeroscope.yaml"], env, work)

    # the job's output is what it is without zeroscope
    plain, under = _losses(work / "out-plain"), _losses(work / "out-zeroscope")
    assert [s for s, _ in plain] == list(range(1, STEPS + 1))
    assert under == plain
    weights = "model.safetensors"
    assert (work / "out-zeroscope" / weights).read_bytes() == (
        work / "out-plain" / weights
    ).read_bytes()
    # the trace has both ranks and every step, and the job's end
    trace = read_trace(work / "t.zstrace")
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
    assert "job exit code 0" in ours.stdout
