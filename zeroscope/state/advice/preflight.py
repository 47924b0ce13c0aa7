"""Rule 8 before a run: what a ds_config will refuse or silently ignore at this world size,
from the config alone (``zeroscope advise ds_config.json --world-size N``).

The batch triad follows DeepSpeed's runtime/config.py ``_set_batch_related_parameters`` and
``_batch_assertion``: any two of train_batch_size, train_micro_batch_size_per_gpu and
gradient_accumulation_steps give the third (integer division), one alone implies accumulation 1,
and train_batch_size must equal micro x accumulation x data-parallel size. The data-parallel size
is the world size over the pipeline and tensor-parallel degrees.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .hf_batch import auto_left, fill_auto
from .model import Advice, Change

TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if float(value).is_integer() and value > 0 else None


def resolve(tb: int | None, mb: int | None, gas: int | None, dp: int) -> tuple[int, int, int]:
    """DeepSpeed's resolution of the triad (integer division where it divides)."""
    if tb is not None and mb is not None and gas is None:
        gas = max(1, tb // (mb * dp))
    elif tb is not None and gas is not None and mb is None:
        mb = max(1, tb // (dp * gas))
    elif mb is not None and tb is None:
        gas = gas or 1
        tb = mb * gas * dp
    elif tb is not None and mb is None:
        gas, mb = 1, max(1, tb // dp)
    assert tb is not None and mb is not None and gas is not None
    return tb, mb, gas


def fix_triad(tb: int, mb: int, gas: int, dp: int) -> dict[str, int]:
    """The smallest change that makes the triad hold, keeping the global batch when it can:
    a new accumulation, else a new micro-batch, else the global batch that micro x
    accumulation x dp gives."""
    if tb % (mb * dp) == 0:
        return {"gradient_accumulation_steps": tb // (mb * dp)}
    if tb % (gas * dp) == 0:
        return {"train_micro_batch_size_per_gpu": tb // (gas * dp)}
    if tb % dp == 0:
        return {"train_micro_batch_size_per_gpu": tb // dp, "gradient_accumulation_steps": 1}
    return {"train_batch_size": mb * gas * dp}


def _on(block: Any) -> bool:
    """A precision block with ``"enabled": true``."""
    return isinstance(block, Mapping) and block.get("enabled") is True


def _error(rule: str, title: str, evidence: str, change: Change, formula: str) -> Advice:
    return Advice(
        rule=rule,
        title=title,
        evidence=(evidence,),
        change=change,
        formula=formula,
        confidence="high",
        severity="error",
    )


def preflight(
    raw: Mapping[str, Any],
    world_size: int,
    *,
    pipeline_stages: int = 1,
    tensor_parallel: int = 1,
    trainer: tuple[int, int] | None = None,
) -> list[Advice]:
    """Advice on a raw ds_config (a parsed JSON/hjson mapping) for ``world_size`` ranks;
    ``trainer``: the Hugging Face Trainer's (per_device_train_batch_size,
    gradient_accumulation_steps), which fill its ``"auto"`` batch keys (:mod:`.hf_batch`)."""
    out: list[Advice] = []
    if trainer is not None:
        raw, out = fill_auto(raw, world_size, *trainer)
    autos = [k for k in TRIAD if raw.get(k) == "auto"]
    if autos:
        out.append(auto_left(autos))
    model_parallel = max(1, pipeline_stages) * max(1, tensor_parallel)
    where = f"world size {world_size}"
    if model_parallel > 1:
        where += f" / (pipeline {pipeline_stages} x tensor {tensor_parallel})"
    if world_size % model_parallel:
        out.append(
            _error(
                "world_size",
                "the world size is not a multiple of the model-parallel degree",
                f"{where}: {world_size} % {model_parallel} = {world_size % model_parallel}",
                Change(code=f"launch a multiple of {model_parallel} ranks"),
                "data-parallel size = world / (pp x tp) must be whole",
            )
        )
        return out
    dp = world_size // model_parallel
    tb, mb, gas = (_int(raw.get(k)) for k in TRIAD)
    if tb is None and mb is None and not autos:
        out.append(
            _error(
                "batch_triad",
                "no batch size: give train_batch_size or train_micro_batch_size_per_gpu",
                "neither key is in the ds_config",
                Change({"train_micro_batch_size_per_gpu": 1}),
                "DeepSpeed asserts one of them is set",
            )
        )
    elif tb is not None or mb is not None:
        r_tb, r_mb, r_gas = resolve(tb, mb, gas, dp)
        if r_tb != r_mb * r_gas * dp:
            fix = fix_triad(r_tb, r_mb, r_gas, dp)
            given = ", ".join(f"{k} {raw[k]}" for k in TRIAD if k in raw)
            out.append(
                _error(
                    "batch_triad",
                    "the batch sizes do not multiply out at this world size",
                    f"{given}; data-parallel size {dp} ({where}): resolved as {r_tb} != "
                    f"{r_mb} x {r_gas} x {dp} = {r_mb * r_gas * dp}",
                    Change(dict(fix)),
                    "train_batch_size = micro x accumulation x data-parallel size (DeepSpeed "
                    "runtime/config.py _batch_assertion)",
                )
            )
    block = raw.get("zero_optimization")
    zero: Mapping[str, Any] = block if isinstance(block, Mapping) else {}
    stage = _int(zero.get("stage", 0)) or 0
    if pipeline_stages > 1 and stage >= 2:
        out.append(
            _error(
                "pipeline_zero",
                f"ZeRO-{stage} is incompatible with pipeline parallelism",
                f"zero_optimization.stage {stage} with {pipeline_stages} pipeline stages",
                Change({"zero_optimization.stage": 1}),
                "DeepSpeed refuses it (ZeRO-2 and ZeRO-3 are incompatible with pipeline "
                "parallelism); stage 1 shards the optimizer state within each stage",
            )
        )
    fp16, bf16 = raw.get("fp16"), raw.get("bf16") or raw.get("bfloat16")
    if _on(fp16) and _on(bf16):
        out.append(
            _error(
                "precision",
                "fp16 and bf16 are both enabled",
                "fp16.enabled and bf16.enabled are both true",
                Change({"fp16.enabled": False}),
                "DeepSpeed refuses both at once",
            )
        )
    param = zero.get("offload_param")
    if isinstance(param, Mapping) and param.get("device") not in (None, "none") and stage != 3:
        out.append(
            Advice(
                rule="offload_param",
                title="offload_param does nothing below stage 3",
                evidence=(f"offload_param.device {param.get('device')!r} at stage {stage}",),
                change=Change({"zero_optimization.offload_param": None}),
                formula="only stage 3 partitions the parameters; DeepSpeed accepts the key and "
                "ignores it",
                confidence="high",
            )
        )
    return out
