"""Offload and resume on the model that broke them (tests/differential/models.py ``OddModel``:
a frozen layer, a 1-element parameter, sizes on both sides of a persistence threshold of 50, a
tied embedding/head, a module called twice, a parameter used outside its module), with
gradient accumulation 3 and clipping 0.6, on 2 gloo ranks; one launch for every case.

- ZeRO-3 ``offload_param`` to NVMe trains exactly like ``offload_param`` on the CPU (the same
  numbers stored elsewhere), fp32 and bf16. It used to give NaN from step 2: each optimizer step
  rewrote the NVMe file from a fresh buffer whose frozen-parameter part was never filled.
- Resume at every stage and offload mode: stop after K optimizer steps, save, build the model
  from another seed, load, continue: the losses equal the uninterrupted run's bit for bit and
  the frozen parameter keeps its value. ZeRO-3 used to lose the frozen parameters' shards (in
  no file) and resumed with the new model's random values.
- zero_to_fp32 of each final checkpoint gives every parameter, frozen ones included, equal to
  the trained model's (gathered) weights.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import pytest
import torch

from tests.distributed import run_ranks

GA, STEPS, K = 3, 4, 2
NVME = "<swap>"  # nvme_path placeholder, replaced by a folder of the test


def _config(stage: int, precision: str, **zero: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": GA,
        "gradient_clipping": 0.6,
        "steps_per_print": 0,
        "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 3}},
        "zero_optimization": {"stage": stage, **zero},
    }
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


def _offload(optimizer: str, param: str = "none") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, device in (("offload_optimizer", optimizer), ("offload_param", param)):
        if device != "none":
            out[key] = {"device": device, **({"nvme_path": NVME} if device == "nvme" else {})}
    return out


def _cases() -> dict[str, dict[str, Any]]:
    s3 = {
        "stage3_param_persistence_threshold": 50,
        "stage3_gather_16bit_weights_on_model_save": True,
    }
    cases = {"s0-fp32": _config(0, "fp32"), "s0-bf16": _config(0, "bf16")}
    for stage in (1, 2):
        for opt in ("none", "cpu", "nvme"):
            cases[f"s{stage}-bf16-opt:{opt}"] = _config(stage, "bf16", **_offload(opt))
    for precision in ("fp32", "bf16"):
        for opt, param in (("none", "none"), ("cpu", "cpu"), ("nvme", "nvme"), ("none", "nvme")):
            name = f"s3-{precision}-opt:{opt}-param:{param}"
            cases[name] = _config(3, precision, **s3, **_offload(opt, param))
    return cases


def _with_path(node: Any, path: str) -> Any:
    if isinstance(node, dict):
        return {k: _with_path(v, path) for k, v in node.items()}
    return path if node == NVME else node


def _ranks(rank: int, world: int, tmp: str) -> dict[str, Any]:
    import torch.distributed as dist

    from tests.differential.models import build_model, loss_of, micro_batches
    from zeroscope.engine.api import initialize
    from zeroscope.engine.zero.stage3 import register_external_parameter
    from zeroscope.engine.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    dist.init_process_group("gloo")
    data = micro_batches(GA * STEPS, rank, world)

    def build(config: dict[str, Any], seed: int) -> Any:
        model = build_model("odd", register_external_parameter, seed)
        return initialize(model=model, config=config)[0]

    def train(engine: Any, steps: range) -> list[float]:
        losses = []
        for k in range(steps.start * GA, steps.stop * GA):
            loss = loss_of(engine, data[k])
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
        return losses

    def weights(engine: Any) -> dict[str, torch.Tensor]:
        if engine.zero_optimization_stage() == 3:
            return engine.strategy.consolidated_16bit_state_dict() or {}
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}

    def one_case(name: str, config: dict[str, Any]) -> dict[str, Any]:
        whole = build(config, seed=0)
        whole_losses = train(whole, range(STEPS))
        whole_weights = weights(whole)
        whole.destroy()
        first = build(config, seed=0)
        before = train(first, range(K))
        ckpt = os.path.join(tmp, name)
        first.save_checkpoint(ckpt)
        first.destroy()
        second = build(config, seed=1)  # another init: everything must come from the files
        second.load_checkpoint(ckpt)
        after = train(second, range(K, STEPS))
        final = weights(second)
        second.save_checkpoint(ckpt, tag="final")
        second.destroy()
        result: dict[str, Any] = {"resumed": before + after, "whole": whole_losses}
        if rank == 0:  # tensors do not travel back from an exited rank: compare here
            fp32 = get_fp32_state_dict_from_zero_checkpoint(ckpt, tag="final")
            result["keys"] = (sorted(final), sorted(whole_weights), sorted(fp32))
            result["resumed_differs"] = [
                k for k, v in whole_weights.items() if not torch.equal(final[k], v)
            ]
            result["fp32_differs"] = [
                k
                for k, v in whole_weights.items()
                if k not in fp32
                or fp32[k].dtype != torch.float32
                or not torch.equal(fp32[k].to(v.dtype), v)
            ]
            result["files"] = sorted(os.listdir(os.path.join(ckpt, "final")))
        return result

    out: dict[str, Any] = {}
    for name, config in _cases().items():
        try:
            out[name] = one_case(name, _with_path(config, os.path.join(tmp, "swap")))
        except Exception:  # both ranks fail alike: report the case, run the next one
            out[name] = {"error": traceback.format_exc()}
    return out


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = str(tmp_path_factory.mktemp("resume"))
    return run_ranks(_ranks, 2, tmp, timeout=600)[0]


def _case(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    r = matrix[name]
    assert "error" not in r, f"{name} failed on a rank:\n{r.get('error')}"
    return r


def test_nvme_parameters_train_like_cpu_parameters(matrix: dict[str, Any]) -> None:
    for precision in ("fp32", "bf16"):
        cpu = _case(matrix, f"s3-{precision}-opt:cpu-param:cpu")["whole"]
        for nvme in ("opt:nvme-param:nvme", "opt:none-param:nvme"):
            got = _case(matrix, f"s3-{precision}-{nvme}")["whole"]
            assert all(torch.isfinite(torch.tensor(got))), (precision, nvme, got)
            assert got == cpu, (precision, nvme)


@pytest.mark.parametrize("name", list(_cases()))
def test_resume_is_exact_and_keeps_frozen_parameters(matrix: dict[str, Any], name: str) -> None:
    r = _case(matrix, name)
    assert r["resumed"] == r["whole"]
    final, whole, fp32 = r["keys"]
    assert final == whole == fp32  # every state_dict entry, the frozen layer's too
    assert "frozen.weight" in whole
    assert r["resumed_differs"] == []  # the frozen parameter included
    # zero_to_fp32: fp32, equal to the trained weights (exactly in fp32; the bf16 model holds
    # the fp32 masters rounded to bf16)
    assert r["fp32_differs"] == []


def test_checkpoint_files_have_deepspeeds_names(matrix: dict[str, Any]) -> None:
    """The names DeepSpeed 0.19.8 writes (seen by running it: tests/test_differential.py)."""
    model = ["mp_rank_00_model_states.pt"]
    optim = [f"{p}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1) for p in ("",)]
    bf16 = ["bf16_" + name for name in optim]
    per_rank = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in (0, 1)]
    assert _case(matrix, "s0-fp32")["files"] == model
    assert _case(matrix, "s0-bf16")["files"] == model
    assert _case(matrix, "s2-bf16-opt:cpu")["files"] == sorted(model + bf16)
    assert _case(matrix, "s3-fp32-opt:none-param:none")["files"] == sorted(per_rank + optim)
    assert _case(matrix, "s3-bf16-opt:nvme-param:nvme")["files"] == sorted(per_rank + bf16)
