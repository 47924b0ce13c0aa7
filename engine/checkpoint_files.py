"""``engine.save_checkpoint`` / ``engine.load_checkpoint`` with DeepSpeed's names, files and
return values, written so that a kill at any instant leaves the previous checkpoint loadable.

Layout: the file names DeepSpeed 0.19.8 writes (runtime/engine.py, checkpoint/constants.py;
checked by running it, tests/test_differential.py)::

    save_dir/latest                                     the newest complete tag (text)
    save_dir/<tag>/mp_rank_00_model_states.pt           stages 0-2, rank 0: module weights, step
                                                        counters, scheduler, loss scaler,
                                                        client_state, the layout that
                                                        zero_to_fp32 needs; at stage 0 also the
                                                        optimizer state and every rank's RNG
                                                        states (DeepSpeed keeps stage 0's
                                                        optimizer in this file too)
    save_dir/<tag>/zero_pp_rank_<r>_mp_rank_00_model_states.pt
                                                        stage 3, every rank: the same, with the
                                                        module's buffers only (its weights are
                                                        the shards)
    save_dir/<tag>/[bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt
                                                        stages 1-3, every rank: its fp32 master
                                                        and Adam shards (from RAM, host or
                                                        NVMe), stage 3's frozen-parameter
                                                        shards, RNG states (CPU, and CUDA's)

Atomicity: every rank writes into ``save_dir/.<tag>.tmp`` (each file flushed and fsynced); after
a barrier rank 0 fsyncs the folder, renames it to ``<tag>`` (an older ``<tag>`` is first
renamed aside and removed after), and only then replaces ``latest`` (tmp file, fsync,
``os.replace``, fsync of the folder). A kill before the final renames leaves ``latest``
pointing at the previous tag, whose files were never touched.

No pickle on disk: each file is a tree of tensors and plain Python values stored as safetensors
(engine/tensor_tree.py), so opening a checkpoint can never run code. ``client_state`` must be
such values too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .checkpoint_layout import strategy_layout
from .deepspeed_checkpoint import is_torch_pickle
from .tensor_tree import load_tree, save_tree

log = logging.getLogger("zeroscope.engine")

MODEL_FILE = "mp_rank_00_model_states.pt"
LATEST = "latest"
SLEEP_ENV = "ZEROSCOPE_CHECKPOINT_TEST_SLEEP"
"""Test hook: seconds to sleep after each file written during a save (to kill a save midway)."""


def optim_file(rank: int, precision: str) -> str:
    prefix = "bf16_" if precision == "bf16" else ""
    return f"{prefix}zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"


def model_file(stage: int, rank: int) -> str:
    """DeepSpeed's model-states name: one file at stages 0-2, one per rank at stage 3."""
    return f"zero_pp_rank_{rank}_{MODEL_FILE}" if stage == 3 else MODEL_FILE


def model_path(folder: Path, rank: int = 0) -> Path:
    """The model-states file ``rank`` reads in a checkpoint folder, whatever its stage."""
    for name in (MODEL_FILE, model_file(3, rank)):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(
        f"checkpoint {folder} has neither {MODEL_FILE} nor {model_file(3, rank)} "
        f"(incomplete checkpoint?)"
    )


def _rng_states(engine: Any) -> dict[str, Any]:
    return {
        "rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
    }


def _gather_rng_states(engine: Any) -> list[dict[str, Any]]:
    """Every rank's RNG states (collective): stage 0 has no per-rank file to keep them in."""
    mine = _rng_states(engine)
    if engine.comm.world_size == 1 or not dist.is_initialized():
        return [mine]
    out: list[dict[str, Any]] = [{} for _ in range(engine.comm.world_size)]
    for key, value in mine.items():
        if value is None:
            for one in out:
                one[key] = None
            continue
        parts = [torch.empty_like(value, device=engine.device) for _ in out]
        dist.all_gather(parts, value.to(engine.device), group=engine.comm.group)
        for one, part in zip(out, parts):
            one[key] = part.cpu()
    return out


def _restore_rng(saved: dict[str, Any]) -> None:
    torch.set_rng_state(saved["rng_state"])
    if saved.get("cuda_rng_state") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(saved["cuda_rng_state"])


def _barrier(engine: Any) -> None:
    if engine.comm.world_size > 1 and dist.is_initialized():
        dist.barrier(group=engine.comm.group)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, obj: Any) -> None:
    save_tree(path, obj, fsync=True)
    pause = float(os.environ.get(SLEEP_ENV, "0") or 0)
    if pause > 0:
        time.sleep(pause)


def _param_ids(module: torch.nn.Module) -> set[int]:
    return {id(p) for p in module.parameters()}


def _module_state(engine: Any) -> dict[str, torch.Tensor]:
    """Weights and buffers (stage 3: buffers only; its weights are the optimizer shards)."""
    params = _param_ids(engine.module)
    out = {}
    for name, value in engine.module.state_dict(keep_vars=True).items():
        if engine.zero_optimization_stage() == 3 and id(value) in params:
            continue
        out[name] = value.detach().clone().cpu()
    return out


_HYPER = ("lr", "betas", "eps", "weight_decay")


def optimizer_hyper(engine: Any) -> list[dict[str, Any]]:
    """Each param group's hyperparameters, as torch's ``Optimizer.state_dict`` keeps them: a
    client LR schedule (the Hugging Face Trainer's) does not re-apply its lr when it is
    reloaded, so the lr of the next step must come back with the optimizer, as in DeepSpeed."""
    return [{k: g[k] for k in _HYPER if k in g} for g in engine.optimizer.param_groups]


def restore_optimizer_hyper(engine: Any, saved: list[dict[str, Any]] | None) -> None:
    for group, values in zip(engine.optimizer.param_groups, saved or []):
        group.update({k: tuple(v) if k == "betas" else v for k, v in values.items()})


def _shard_optimizer_state(engine: Any) -> dict[str, Any]:
    """A torch optimizer other than Adam(W) keeps its own per-shard state (momentum, sums)."""
    other = engine.optimizer.shard_optimizer
    return {} if other is None else {"shard_optimizer": other.state()}


def _restore_shard_optimizer(engine: Any, saved: list[dict[str, Any]] | None) -> None:
    other = engine.optimizer.shard_optimizer
    if other is not None:
        other.load(saved or [])


def save_checkpoint(
    engine: Any, save_dir: str, tag: str | None, client_state: dict[str, Any], save_latest: bool
) -> bool:
    """See the module docstring. Every rank must call it. Returns True, as DeepSpeed."""
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    if not tag or "/" in tag or tag.startswith("."):
        raise ValueError(f"checkpoint tag {tag!r} must be a plain folder name")
    root = Path(save_dir)
    tmp, final = root / f".{tag}.tmp", root / tag
    rank = engine.comm.rank
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    _barrier(engine)
    stage = engine.zero_optimization_stage()
    optim = {
        "optimizer_state_dict": engine.strategy.state_dict(),
        **_shard_optimizer_state(engine),
        "rank": rank,
        "dp_world_size": engine.comm.world_size,
        "zero_stage": stage,
        **_rng_states(engine),
    }
    extra: dict[str, Any] = {}
    if stage == 0:  # every rank holds the same optimizer state: one file, as DeepSpeed
        extra = {"optimizer": optim, "rng_states": _gather_rng_states(engine)}
    else:
        _write(tmp / optim_file(rank, engine._config.precision), optim)
    if rank == 0 or stage == 3:
        scheduler = engine.lr_scheduler
        _write(
            tmp / model_file(stage, rank),
            {
                **extra,
                "module": _module_state(engine),
                "layout": strategy_layout(engine),
                "global_steps": engine.global_steps,
                "global_samples": engine.global_samples,
                "skipped_steps": engine.skipped_steps,
                "micro_steps": engine.micro_steps,
                "lr_scheduler": scheduler.state_dict() if scheduler is not None else None,
                "optimizer_hyper": optimizer_hyper(engine),
                "loss_scaler": {
                    "type": type(engine.scaler).__name__,
                    **dataclasses.asdict(engine.scaler),
                },
                "dp_world_size": engine.comm.world_size,
                "zero_stage": engine.zero_optimization_stage(),
                "precision": engine._config.precision,
                "client_state": dict(client_state),
            },
        )
    _barrier(engine)
    if rank == 0:
        _fsync_dir(tmp)
        old = root / f".{tag}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        if save_latest:
            latest_tmp = root / f".{LATEST}.tmp"
            with open(latest_tmp, "w") as f:
                f.write(tag)
                f.flush()
                os.fsync(f.fileno())
            os.replace(latest_tmp, root / LATEST)
        _fsync_dir(root)
    _barrier(engine)
    engine.reporter.tel.event("checkpoint", f"saved {final}")
    return True


def resolve(load_dir: str, tag: str | None) -> Path | None:
    """The folder of ``tag`` (default: the one ``latest`` names); None when there is none."""
    root = Path(load_dir)
    if tag is None:
        try:
            tag = (root / LATEST).read_text().strip()
        except FileNotFoundError:
            return None
    path = root / tag
    if not path.is_dir() and (root / f".{tag}.old").is_dir():
        return root / f".{tag}.old"  # killed between the two renames of an overwrite
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    return path


def _load(path: Path) -> Any:
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint file {path} is missing (incomplete checkpoint?)")
    if is_torch_pickle(path):
        raise ValueError(
            f"{path} is a torch pickle (a DeepSpeed checkpoint?), not this engine's: consolidate "
            f"it with `python -m zeroscope.engine.zero_to_fp32 {path.parent.parent} weights.pt` "
            f"and load those weights into the model before initialize()"
        )
    return load_tree(path)


def load_checkpoint(
    engine: Any,
    load_dir: str,
    tag: str | None = None,
    load_module_strict: bool = True,
    load_optimizer_states: bool = True,
    load_lr_scheduler_states: bool = True,
    load_module_only: bool = False,
) -> tuple[str | None, dict[str, Any] | None]:
    """Restore a checkpoint; returns ``(path, client_state)``, or ``(None, None)`` when
    ``load_dir`` has no ``latest`` (DeepSpeed's contract). Every rank must call it."""
    path = resolve(load_dir, tag)
    if path is None:
        log.warning("no 'latest' file in %s: nothing loaded", load_dir)
        return None, None
    model = _load(model_path(path, engine.comm.rank))
    stage, world = engine.zero_optimization_stage(), engine.comm.world_size
    with_optimizer = load_optimizer_states and not load_module_only
    if (model["zero_stage"], model["dp_world_size"]) != (stage, world) and with_optimizer:
        raise ValueError(
            f"checkpoint {path} was saved at ZeRO stage {model['zero_stage']} on "
            f"{model['dp_world_size']} ranks; this run is stage {stage} on {world} (resharding "
            f"is not supported: consolidate it with zeroscope.engine.zero_to_fp32)"
        )
    strict = load_module_strict and stage != 3
    engine.module.load_state_dict(model["module"], strict=strict)
    inner = getattr(engine.strategy, "inner", engine.strategy)
    if with_optimizer and "optimizer" in model:  # stage 0: one file holds it all
        engine.strategy.load_state_dict(model["optimizer"]["optimizer_state_dict"])
        _restore_shard_optimizer(engine, model["optimizer"].get("shard_optimizer"))
        restore_optimizer_hyper(engine, model.get("optimizer_hyper"))
        _restore_rng(model["rng_states"][engine.comm.rank])
    elif with_optimizer:
        optim = _load(path / optim_file(engine.comm.rank, engine._config.precision))
        engine.strategy.load_state_dict(optim["optimizer_state_dict"])
        _restore_shard_optimizer(engine, optim.get("shard_optimizer"))
        restore_optimizer_hyper(engine, model.get("optimizer_hyper"))
        _restore_rng(optim)
    elif stage == 3:
        raise ValueError(
            "loading only the module of a stage-3 checkpoint is not supported (its weights are "
            "the optimizer shards): load with load_optimizer_states=True or use zero_to_fp32"
        )
    else:  # fresh optimizer state, masters from the loaded weights
        from .offload import param_shard_views

        state = engine.strategy.state_dict()
        for saved, view in zip(state["shards"], param_shard_views(inner)):
            saved["master"] = view.detach().float().clone()
            saved["exp_avg"].zero_()
            saved["exp_avg_sq"].zero_()
            saved["step"] = 0
        engine.strategy.load_state_dict(state)
        _restore_shard_optimizer(engine, [])
    if not load_module_only:
        scheduler = engine.lr_scheduler
        if load_lr_scheduler_states and scheduler is not None and model["lr_scheduler"]:
            scheduler.load_state_dict(model["lr_scheduler"])
        scaler = dict(model["loss_scaler"])
        if scaler.pop("type") == type(engine.scaler).__name__:
            for key, value in scaler.items():
                setattr(engine.scaler, key, value)
        engine.global_steps = model["global_steps"]
        engine.global_samples = model["global_samples"]
        engine.skipped_steps = model["skipped_steps"]
        engine.micro_steps = model["micro_steps"]
        # The resumed run's steps are numbered on from the checkpoint's, as DeepSpeed's are.
        engine.reporter.tel.number_steps_from(engine.global_steps + 1)
    engine.reporter.tel.event("checkpoint", f"loaded {path}")
    return str(path), model["client_state"]
