"""One training script, run cell after cell on one engine in one 2-rank launch.

``run_engine(rank, world, engine, cells, tmp)`` is the rank function (tests/distributed.py's
``run_ranks``): for each cell it builds a fresh model (seed 0), initializes the engine named
``"ours"`` (``zeroscope.engine``) or ``"deepspeed"`` (DeepSpeed 0.19.8, CPU accelerator, gloo)
with the cell's ds_config, trains, and records what the user of either engine can observe:
each micro-step's loss, each optimizer step's grad norm and lr, the gathered final weights,
the ``save_16bit_model`` file, and a checkpoint's consolidated fp32 weights. Nothing is cached
across cells or launches. A cell that raises is recorded as an error and the next one runs
(both ranks fail alike, so no collective is left waiting).

Tensors go back to the test as numpy float32 arrays (exact for bf16): torch tensors sent from a
rank process that has exited cannot be received.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback
from typing import Any

import numpy as np
import torch

from .cells import Cell, client_optimizer
from .models import build_model, loss_of, micro_batches


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().contiguous().numpy().copy()


def _tensors(state: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    values = {k: _np(v) for k, v in state.items() if isinstance(v, torch.Tensor)}
    dtypes = {k: str(v.dtype) for k, v in state.items() if isinstance(v, torch.Tensor)}
    return values, dtypes


def _read_model_file(path: str) -> dict[str, torch.Tensor]:
    """A saved state dict, torch pickle or safetensors, whichever the file holds."""
    from safetensors.torch import load_file

    from zeroscope.engine.deepspeed_checkpoint import is_torch_pickle

    if is_torch_pickle(path):
        return dict(torch.load(path, map_location="cpu", weights_only=True))
    return load_file(path)


class _Engine:
    """The few calls that differ between the two engines (imports and introspection); the
    training script itself is the same for both."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "deepspeed":
            import deepspeed
            from deepspeed.ops.op_builder import AsyncIOBuilder

            self.ds = deepspeed
            self.register = deepspeed.zero.register_external_parameter
            # DeepSpeed's NVMe offload needs its async_io op, which needs libaio.
            self.aio = bool(AsyncIOBuilder().is_compatible(verbose=False))
        else:
            from zeroscope.engine.zero.stage3 import register_external_parameter

            self.register = register_external_parameter

    def initialize(self, model: torch.nn.Module, config: dict[str, Any], optimizer: str) -> Any:
        client = None
        if optimizer.startswith("client-"):
            client = client_optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        if self.name == "deepspeed":
            engine, *_ = self.ds.initialize(
                model=model,
                model_parameters=model.parameters(),
                optimizer=client,
                config=config,
                dist_init_required=False,
            )
            return engine
        from zeroscope.engine.api import initialize

        engine, *_ = initialize(
            model=model, model_parameters=model.parameters(), optimizer=client, config=config
        )
        return engine

    def full_weights(self, engine: Any) -> dict[str, torch.Tensor]:
        """Every state_dict entry, gathered whole (collective at stage 3; rank 0's answer)."""
        if engine.zero_optimization_stage() == 3:
            if self.name == "deepspeed":
                return dict(engine._zero3_consolidated_16bit_state_dict() or {})
            return engine.strategy.consolidated_16bit_state_dict() or {}
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}

    def fp32_weights(self, folder: str) -> dict[str, torch.Tensor]:
        if self.name == "deepspeed":
            from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            return {
                k: v.contiguous()
                for k, v in get_fp32_state_dict_from_zero_checkpoint(folder).items()
            }
        from zeroscope.engine.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(folder)

    def adam_steps(self, engine: Any) -> int:
        """The optimizer's own step count (Adam's bias-correction t)."""
        if self.name == "deepspeed":
            opt = engine.optimizer
            inner = getattr(opt, "optimizer", opt)
            steps = [int(s["step"]) for s in inner.state.values() if "step" in s]
            return max(steps, default=0)
        return int(engine.strategy.state_dict()["shards"][0]["step"])

    def destroy(self, engine: Any) -> None:
        engine.destroy()


def _train(engine: Any, cell: Cell, data: list[Any], steps: range, out: dict[str, list]) -> None:
    ga = cell.accumulation
    for k in range(steps.start * ga, steps.stop * ga):
        loss = loss_of(engine, data[k])
        engine.backward(loss)
        engine.step()
        out["losses"].append(float(loss.detach()))
        if (k + 1) % ga == 0:
            norm = engine.get_global_grad_norm()
            out["grad_norms"].append(None if norm is None else float(norm))
            out["lrs"].append(float(engine.get_lr()[0]))


def run_cell(eng: _Engine, cell: Cell, rank: int, world: int, tmp: str) -> dict[str, Any]:
    if eng.name == "deepspeed" and cell.offload == "nvme" and not eng.aio:
        return {"unavailable": "DeepSpeed's async_io op cannot be built here (no libaio)"}
    folder = os.path.join(tmp, eng.name, cell.name.replace("/", "_"))
    config = cell.ds_config(os.path.join(folder, "swap"))
    data = micro_batches(cell.steps * cell.accumulation, rank, world)
    out: dict[str, Any] = {"losses": [], "grad_norms": [], "lrs": []}
    engine = eng.initialize(build_model(cell.model, eng.register, 0), config, cell.optimizer)
    if cell.resume_at is None:
        _train(engine, cell, data, range(cell.steps), out)
    else:
        whole: dict[str, list] = {"losses": [], "grad_norms": [], "lrs": []}
        _train(engine, cell, data, range(cell.steps), whole)
        eng.destroy(engine)
        out["uninterrupted"] = whole
        engine = eng.initialize(build_model(cell.model, eng.register, 0), config, cell.optimizer)
        _train(engine, cell, data, range(cell.resume_at), out)
        engine.save_checkpoint(os.path.join(folder, "resume"))
        eng.destroy(engine)
        engine = eng.initialize(build_model(cell.model, eng.register, 1), config, cell.optimizer)
        path, _ = engine.load_checkpoint(os.path.join(folder, "resume"))
        assert path is not None, "load_checkpoint found nothing"
        _train(engine, cell, data, range(cell.resume_at, cell.steps), out)
    if cell.optimizer in ("AdamW", "client-AdamW"):
        out["adam_steps"] = eng.adam_steps(engine)
    weights = eng.full_weights(engine)
    # DeepSpeed's default name; DeepSpeed 0.19.8 writes torch.save whatever the name says.
    engine.save_16bit_model(folder, "pytorch_model.bin")
    engine.save_checkpoint(os.path.join(folder, "final"), tag="final")
    eng.destroy(engine)
    if rank == 0:
        out["weights"], out["weight_dtypes"] = _tensors(weights)
        out["model16"], out["model16_dtypes"] = _tensors(
            _read_model_file(os.path.join(folder, "pytorch_model.bin"))
        )
        ckpt = os.path.join(folder, "final")
        out["checkpoint"] = ckpt  # kept (the test's temporary folder) for the CLI test
        out["files"] = sorted(os.listdir(os.path.join(ckpt, "final")))
        if cell.stage > 0 or eng.name == "ours":  # DeepSpeed's script has no stage 0
            out["fp32"], _ = _tensors(eng.fp32_weights(ckpt))
        if eng.name == "deepspeed":  # our zero_to_fp32 on DeepSpeed's own checkpoint
            from zeroscope.engine.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

            out["ours_on_ds_fp32"], _ = _tensors(get_fp32_state_dict_from_zero_checkpoint(ckpt))
    return out


def run_engine(rank: int, world: int, engine: str, cells: list[Cell], tmp: str) -> dict[str, Any]:
    """The rank function: every cell on ``engine``; returns {cell name: result or error}."""
    os.environ["DS_ACCELERATOR"] = "cpu"
    import logging

    import torch.distributed as dist

    # A rank left alone in a collective (its peer failed the cell) errors out instead of hanging.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    eng = _Engine(engine)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    results: dict[str, Any] = {}
    linear = torch.nn.functional.linear
    for cell in cells:
        start = time.perf_counter()
        try:
            results[cell.name] = run_cell(eng, cell, rank, world, tmp)
        except Exception:
            results[cell.name] = {"error": traceback.format_exc()}
        results[cell.name]["seconds"] = time.perf_counter() - start
        # DeepSpeed's stage 3 replaces torch.nn.functional.linear for the whole process ("This
        # will persist unless manually reset"): matmul + add instead of addmm, which rounds
        # differently in bf16. Each cell starts from torch's own.
        torch.nn.functional.linear = linear
    return results
