"""The Hugging Face ``Trainer`` with ``TrainingArguments(deepspeed=ds_config)`` on the bundled
engine under the ``deepspeed`` alias, against the same Trainer job on DeepSpeed 0.19.8 itself
(tests/hf_trainer_job.py: ZeRO-2 on GPT-2, ZeRO-3 under ``zero.Init`` on a grouped-query,
tied-embedding Llama; fp32; 2 gloo ranks; training, evaluation, ``save_model``, checkpoints and
``resume_from_checkpoint``).

The engine's job runs with the real package made unimportable and its distribution hidden (as if
DeepSpeed were not installed), and must not have loaded a single module from it. The
tutorial-script test (test_tutorial_script.py) covers the alias with the real package present.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.distributed import DEEPSPEED, run_ranks

pytestmark = pytest.mark.slow

TIMEOUT = 900.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    from tests import hf_trainer_job

    out = {}
    for engine in ("deepspeed", "alias-without-deepspeed"):
        folder = tmp_path_factory.mktemp(engine)
        preload = DEEPSPEED if engine == "deepspeed" else ()  # the alias job must not have it
        ranks = run_ranks(
            hf_trainer_job.run, 2, engine, str(folder), timeout=TIMEOUT, preload=preload
        )
        out[engine] = ranks[0]
    return out


def _close(a: float, b: float, rel: float) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


@pytest.mark.parametrize("stage", [2, 3])
def test_trainer_matches_deepspeed(runs: dict[str, dict[str, Any]], stage: int) -> None:
    ref, ours = runs["deepspeed"][f"stage{stage}"], runs["alias-without-deepspeed"][f"stage{stage}"]
    assert [e["step"] for e in ours["logs"]] == [1, 2, 3, 4]
    for theirs, mine in zip(ref["logs"], ours["logs"], strict=True):
        assert theirs["step"] == mine["step"]
        assert _close(theirs["loss"], mine["loss"], 1e-5), (theirs, mine)
        assert _close(theirs["grad_norm"], mine["grad_norm"], 1e-5), (theirs, mine)
        assert theirs["learning_rate"] == mine["learning_rate"]
    assert _close(ref["eval_loss"], ours["eval_loss"], 1e-5)
    assert ref["weights"].keys() == ours["weights"].keys()
    for name, values in ref["weights"].items():
        worst = max(abs(a - b) for a, b in zip(values, ours["weights"][name], strict=True))
        assert worst <= 1e-5, (name, worst)
    # resuming from the step-2 checkpoint continues exactly where the run went on (the resumed
    # Trainer's history starts with steps 1-2 read back from the checkpoint)
    assert [e["step"] for e in ours["resumed_logs"]] == [1, 2, 3, 4]
    assert ours["resumed_logs"][:2] == ours["logs"][:2]
    for straight, resumed in zip(ours["logs"][2:], ours["resumed_logs"][2:], strict=True):
        assert _close(straight["loss"], resumed["loss"], 1e-6)
        assert _close(straight["grad_norm"], resumed["grad_norm"], 1e-6)
    # DeepSpeed's checkpoint file names inside the Trainer's checkpoint
    assert "mp_rank_00_model_states.pt" in " ".join(ours["checkpoint"])


def test_engine_job_never_touched_the_real_package(runs: dict[str, dict[str, Any]]) -> None:
    ours = runs["alias-without-deepspeed"]
    assert ours["real_deepspeed_modules"] == []
    assert "zeroscope" in ours["deepspeed_file"] or "engine" in ours["deepspeed_file"]
    assert runs["deepspeed"]["real_deepspeed_modules"]  # the oracle ran on the real one
