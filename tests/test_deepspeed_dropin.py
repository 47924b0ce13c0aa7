"""The engine behind ``import zeroscope.engine as deepspeed`` against DeepSpeed 0.19.8 itself:
tests/dropin_job.py runs the same scenarios on both (2 gloo ranks, one launch per engine) and
every answer is compared here.

- accelerate's driving (``set_gradient_accumulation_boundary``, ``backward(scale_wrt_gas=...)``,
  ``step()`` only at boundaries): the same losses, returned losses, lr, grad norms, counters;
- ``save_16bit_model``: DeepSpeed's ``pytorch_model.bin`` (a ``torch.save``d state dict, same
  names, dtypes and values); a ``.safetensors`` name is real safetensors here (DeepSpeed writes
  a pickle under that name, which this test shows);
- ``zero.Init`` partitions as DeepSpeed does (placeholders, ``ds_numel``/``ds_shape``, shards of
  ceil(numel / N)), ``GatheredParameters`` gathers the same values and writes a modifier rank's
  change into every rank's shard, ``initialize`` adopts the partitioned model and trains it
  with DeepSpeed's losses.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.distributed import DEEPSPEED, run_ranks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    from tests import dropin_job

    out = {}
    for engine in ("deepspeed", "zeroscope"):
        folder = tmp_path_factory.mktemp(engine)
        preload = DEEPSPEED if engine == "deepspeed" else ()
        out[engine] = run_ranks(
            dropin_job.run, 2, engine, str(folder), timeout=600, preload=preload
        )
    return out


def _close(a: Any, b: Any, rel: float = 1e-5) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if a is None or b is None or isinstance(a, bool):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-6)


def test_accelerate_style_boundaries(runs: dict[str, list[dict[str, Any]]]) -> None:
    for ref, ours in zip(runs["deepspeed"], runs["zeroscope"], strict=True):
        theirs, mine = ref["boundary"], ours["boundary"]
        assert mine["boundary"] == theirs["boundary"] == [False, True] * 6
        assert _close(mine["losses"], theirs["losses"])
        assert _close(mine["returned"], theirs["returned"])
        assert _close(mine["lr"], theirs["lr"], 1e-12)
        assert _close(mine["norm"], theirs["norm"])
        assert mine["applied"] == theirs["applied"] == [True] * 6
        assert mine["counters"] == theirs["counters"]
        assert mine["config_get"] == theirs["config_get"] == 1.0
        assert mine["grads_after_zero_grad"] == theirs["grads_after_zero_grad"]


def test_bf16_step_with_inf_gradients_is_skipped(runs: dict[str, list[dict[str, Any]]]) -> None:
    for ref, ours in zip(runs["deepspeed"], runs["zeroscope"], strict=True):
        theirs, mine = ref["overflow"], ours["overflow"]
        assert mine["applied"] == theirs["applied"] == [True, False, True]
        assert mine["skipped"] == theirs["skipped"] == [0, 1, 1]
        assert mine["unchanged"] == theirs["unchanged"] == [False, True, False]
        assert math.isinf(mine["norm"][1]) and math.isinf(theirs["norm"][1])
        assert _close(mine["norm"][0], theirs["norm"][0], 1e-2)


@pytest.mark.parametrize("stage", [1, 3])
def test_save_16bit_model_writes_deepspeeds_file(
    runs: dict[str, list[dict[str, Any]]], stage: int
) -> None:
    theirs = runs["deepspeed"][0]["save16"][f"stage{stage}"]
    mine = runs["zeroscope"][0]["save16"][f"stage{stage}"]
    assert mine["saved"] == theirs["saved"] == [True, True]
    ref, ours = theirs["files"]["pytorch_model.bin"], mine["files"]["pytorch_model.bin"]
    assert ours["format"] == ref["format"] == "torch.save"
    assert (
        ours["dtypes"] == ref["dtypes"] == (["torch.bfloat16"] if stage == 1 else ["torch.float32"])
    )
    assert ours["tensors"].keys() == ref["tensors"].keys()
    for name, values in ref["tensors"].items():
        assert _close(ours["tensors"][name], values, 1e-2 if stage == 1 else 1e-5), name
    # A .safetensors name: real safetensors here; DeepSpeed 0.19.8 torch.saves under any name.
    assert mine["files"]["m.safetensors"]["format"] == "safetensors"
    assert theirs["files"]["m.safetensors"]["format"] == "torch.save"
    assert mine["files"]["m.safetensors"]["tensors"] == ours["tensors"]


def test_zero_init_and_gathered_parameters(runs: dict[str, list[dict[str, Any]]]) -> None:
    for rank, (ref, ours) in enumerate(zip(runs["deepspeed"], runs["zeroscope"], strict=True)):
        theirs, mine = ref["zero_init"], ours["zero_init"]
        for key in ("placeholder_numel", "ds_numel", "ds_shape", "shard_numel"):
            assert mine[key] == theirs[key], (rank, key)
        assert set(mine["placeholder_numel"]) == {0}  # no rank holds a full parameter
        assert mine["gathered"] == theirs["gathered"]
        assert mine["after_exit_numel"] == theirs["after_exit_numel"] == 0
        assert mine["modified"] == theirs["modified"]
        assert mine["modified"][0][:3] == [0.0, 1.0, 2.0]  # rank 0's write reached every rank
        assert _close(mine["losses"], theirs["losses"])
        assert _close(mine["trained_fc"], theirs["trained_fc"])
