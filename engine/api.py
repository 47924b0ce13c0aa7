"""``initialize``: DeepSpeed's entry point, and ``add_config_arguments`` / ``init_distributed``.
A DeepSpeed script ports by changing its import (the package forwards DeepSpeed's names, see
engine/deepspeed/)::

    import zeroscope.engine as deepspeed   # was: import deepspeed
    engine, optimizer, dataloader, lr_scheduler = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config="ds_config.json")

docs/engine.md lists the DeepSpeed calls that are supported.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from zeroscope.agent.api import telemetry

from .config import ConfigError, DeepSpeedConfig, load_config, read_raw, report_ignored
from .dataloader import training_loader
from .engine import ZeroEngine
from .lr_schedules import schedule_from_config
from .offload import make_offload
from .optim import AdamState, ZeroOptimizer
from .parallel.setup import plan_parallel
from .precision import DTYPES, make_loss_scaler
from .process_group import Comm, pick_device
from .process_group import init_distributed as _init_distributed
from .report import Reporter, largest_layer, model_bytes, param_numel
from .zero.stage3.placement import move_buffers
from .zero.stage3.zero_init import materialize
from .zero.stages import make_strategy

__all__ = ["ConfigError", "ZeroEngine", "add_config_arguments", "init_distributed", "initialize"]

_GROUP_KEYS = {"params", "lr", "betas", "eps", "weight_decay"}


def _is_adam(client: Any) -> bool:
    return isinstance(client, torch.optim.Adam | torch.optim.AdamW)


def _param_groups(
    module: torch.nn.Module, model_parameters: Any, client_optimizer: Any, *, any_keys: bool
) -> list[dict[str, Any]]:
    """Trainable parameter groups (each parameter once, even when tied). ``any_keys``: a torch
    optimizer other than Adam(W) steps the shards, and its groups keep whatever keys it takes
    (momentum, dampening, ...)."""
    if client_optimizer is not None:
        raw: list[Any] = [dict(g) for g in client_optimizer.param_groups]
    elif model_parameters is None:
        raw = [{"params": list(module.parameters())}]
    else:
        items = (
            list(model_parameters) if isinstance(model_parameters, Iterable) else [model_parameters]
        )
        if items and isinstance(items[0], Mapping):
            raw = [dict(g) for g in items]
        else:
            raw = [{"params": items}]
    seen: set[int] = set()
    groups = []
    for g in raw:
        unknown = (
            set(g)
            - _GROUP_KEYS
            - {
                "initial_lr",
                "amsgrad",
                "foreach",
                "maximize",
                "capturable",
                "differentiable",
                "fused",
                "decoupled_weight_decay",
            }
        )
        if unknown and not any_keys:
            raise ConfigError(
                f"param group key {sorted(unknown)[0]!r} is not supported (supported: {sorted(_GROUP_KEYS)})"
            )
        params = [p for p in g["params"] if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            kept = {k: v for k, v in g.items() if any_keys or k in _GROUP_KEYS}
            groups.append({**kept, "params": params})
    if not groups:
        raise ConfigError("the model has no trainable parameters")
    return groups


def _optimizer(cfg: DeepSpeedConfig, groups: list[dict[str, Any]], client: Any) -> ZeroOptimizer:
    if client is not None:
        if cfg.optimizer is not None:
            raise ConfigError(
                "an optimizer is given both in ds_config and to initialize(); give one"
            )
        if not _is_adam(client):
            # DeepSpeed runs any torch optimizer on its fp32 partitions: so does the engine.
            d = {k: v for k, v in client.defaults.items() if k != "params"}
            zero_opt = ZeroOptimizer(
                groups,
                defaults=d,
                name=type(client).__name__,
                decoupled=False,
                torch_class=type(client),
            )
            client.param_groups = zero_opt.param_groups
            return zero_opt
        if any(g.get("amsgrad") or g.get("maximize") for g in client.param_groups):
            raise ConfigError("amsgrad / maximize are not supported")
        d = client.defaults
        decoupled = isinstance(client, torch.optim.AdamW) or bool(d.get("decoupled_weight_decay"))
        defaults = {k: d[k] for k in ("lr", "betas", "eps", "weight_decay")}
        zero_opt = ZeroOptimizer(
            groups, defaults=defaults, name=type(client).__name__, decoupled=decoupled
        )
        # A scheduler the user built on the client optimizer keeps working: both now share
        # one list of param groups, so its lr writes reach the engine.
        client.param_groups = zero_opt.param_groups
        return zero_opt
    if cfg.optimizer is None:
        raise ConfigError("no optimizer: add an 'optimizer' block to ds_config or pass optimizer=")
    if cfg.optimizer.torch_params is not None:
        cls = getattr(torch.optim, cfg.optimizer.type)
        return ZeroOptimizer(
            groups,
            defaults=dict(cfg.optimizer.torch_params),
            name=cfg.optimizer.type,
            decoupled=False,
            torch_class=cls,
        )
    p = cfg.optimizer.params
    defaults = {"lr": p.lr, "betas": tuple(p.betas), "eps": p.eps, "weight_decay": p.weight_decay}
    return ZeroOptimizer(
        groups,
        defaults=defaults,
        name=cfg.optimizer.type,
        decoupled=cfg.optimizer.decoupled_weight_decay,
    )


def add_config_arguments(parser: Any) -> Any:
    """DeepSpeed's ``add_config_arguments``: ``--deepspeed``, ``--deepspeed_config PATH`` and the
    deprecated ``--deepscale`` / ``--deepscale_config`` (read by :func:`initialize` from
    ``args``)."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument("--deepspeed", default=False, action="store_true", help="use the engine")
    group.add_argument("--deepspeed_config", default=None, type=str, help="ds_config.json path")
    group.add_argument("--deepscale", default=False, action="store_true", help="deprecated")
    group.add_argument("--deepscale_config", default=None, type=str, help="deprecated")
    return parser


def init_distributed(
    dist_backend: str | None = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: Any = None,
    init_method: str | None = None,
    dist_init_required: bool | None = None,
    config: Any = None,
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """DeepSpeed's ``init_distributed``: torch.distributed from torchrun's environment (nccl on
    CUDA, gloo on CPU, or ``dist_backend``) with this rank's GPU made current and bound to the
    group, or from explicit ``rank``/``world_size`` and ``init_method``; a no-op without that
    environment (one rank, no process group, unless world-1 collectives are forced) or when it
    is initialized already. MPI discovery is not done (launch with torchrun)."""
    import torch.distributed as dist

    if dist_init_required is False or dist.is_initialized():
        return
    device = pick_device()
    explicit = rank >= 0 and world_size > 0
    if not explicit and timeout is None and init_method is None:
        _init_distributed(device, backend=dist_backend)
        return
    if not explicit and "RANK" not in os.environ:
        return
    backend = dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    kwargs: dict[str, Any] = {"backend": backend}
    if device.type == "cuda" and "nccl" in backend:
        kwargs["device_id"] = device  # an eager NCCL communicator bound to this rank's GPU
    if timeout is not None:
        kwargs["timeout"] = timeout
    if init_method is not None:
        kwargs["init_method"] = init_method
    if explicit:
        kwargs.update(rank=rank, world_size=world_size)
    dist.init_process_group(**kwargs)


def _config_source(args: Any, config: Any, config_params: Any) -> Any:
    """The ds_config from ``config`` / ``config_params`` / ``args.deepspeed_config`` (or the
    deprecated ``args.deepscale_config``), refusing two at once as DeepSpeed does."""
    if config is None:
        config = config_params
    from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if from_args is not None:
        if config is not None:
            raise ConfigError(
                "a ds_config is given both in args.deepspeed_config and to initialize(); give one"
            )
        config = from_args
    if config is None:
        raise ConfigError(
            "initialize() needs config= (a ds_config path or dict) or args.deepspeed_config"
        )
    return config


def initialize(
    args: Any = None,
    model: torch.nn.Module | None = None,
    optimizer: Any = None,
    model_parameters: Any = None,
    training_data: Any = None,
    lr_scheduler: Any = None,
    distributed_port: int = 29500,
    mpu: Any = None,
    dist_init_required: bool | None = None,
    collate_fn: Any = None,
    config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    mesh_param: Any = None,
    config_params: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    auto_values: Mapping[str, Any] | None = None,
) -> tuple[ZeroEngine, ZeroOptimizer, Any, Any]:
    """Build the engine; returns ``(engine, optimizer, dataloader, lr_scheduler)`` as DeepSpeed.

    ``config`` is a path, a JSON/hjson string or a dict (``config_params`` is DeepSpeed's older
    name; ``args.deepspeed_config`` is read too; ``engine.config`` is that dict). Parameters
    partitioned by ``zero.Init`` are adopted as they are. ``distributed_port`` is accepted and
    unused (torchrun's MASTER_PORT is read). ``auto_values`` fills ``"auto"`` entries by
    dotted key. ``training_data`` (a Dataset) yields a DataLoader of micro-batches with a
    DistributedSampler. ``lr_scheduler`` may be a scheduler or a callable taking the optimizer.
    """
    if model is None:
        raise ConfigError("initialize() needs model=")
    if mesh_param is not None:
        raise ConfigError("mesh_param (sequence parallelism) is not supported yet")
    source = _config_source(args, config, config_params)
    raw = source if isinstance(source, dict) else read_raw(source)
    device = pick_device()
    if dist_init_required is not False:
        _init_distributed(device)
    tel = telemetry()
    tel.bind_device(str(device))  # before the init broadcasts, so they are timed on the device
    # 3D parallelism (engine/parallel/setup.py): ZeRO over the data-parallel group only.
    parallel = plan_parallel(model, raw, mpu, tel, device)
    comm = parallel.dp_comm if parallel is not None else Comm.data_parallel(tel, device)
    cfg = load_config(raw, dp_world_size=comm.world_size, auto_values=auto_values)
    report_ignored(cfg, rank=comm.rank)

    built = model_bytes(model)  # before the cast: what each rank held whole at start-up
    dtype = DTYPES[cfg.precision] if cfg.precision != "fp32" else None
    if cfg.zero_optimization.stage < 3:  # zero.Init partitioned it; stages 0-2 keep it whole
        materialize(model)
        model.to(device=device, dtype=dtype)
    else:  # the partition moves the parameters one at a time: never the whole model on device
        move_buffers(model, device, dtype)
    if parallel is not None:
        model_parameters = parallel.prepare_model(model, cfg, model_parameters, optimizer)
    other = (optimizer is not None and not _is_adam(optimizer)) or (
        cfg.optimizer is not None and cfg.optimizer.torch_params is not None
    )
    groups = _param_groups(model, model_parameters, optimizer, any_keys=other)
    if parallel is not None:
        groups = parallel.split_groups(groups)
    zero_opt = _optimizer(cfg, groups, optimizer)
    # Counted before the strategy is built: stage 3 leaves empty placeholders in the module.
    total, largest = sum(param_numel(p) for p in model.parameters()), largest_layer(model)
    strategy_groups = [g["params"] for g in zero_opt.param_groups]
    if parallel is not None:
        strategy_groups = parallel.strategy_groups(strategy_groups)
    strategy = make_strategy(module=model, groups=strategy_groups, comm=comm, config=cfg)
    strategy = make_offload(strategy, config=cfg, comm=comm)
    if zero_opt.shard_optimizer is not None:
        if getattr(strategy, "optimizer_step", None) is not None:
            raise ConfigError(
                f"optimizer offload steps Adam(W) only; {zero_opt.name} is not supported there "
                "(DeepSpeed's own CPU Adagrad/Lion kernels are not built)"
            )
        for shard in strategy.shards:  # the torch optimizer keeps its own state
            shard.state = AdamState.elsewhere(shard.master.device)
    scheduler: Any = lr_scheduler
    if cfg.scheduler is not None:
        if lr_scheduler is not None:
            raise ConfigError(
                "a scheduler is given both in ds_config and to initialize(); give one"
            )
        scheduler = schedule_from_config(zero_opt, cfg.scheduler)
    elif callable(lr_scheduler) and not hasattr(lr_scheduler, "step"):
        scheduler = lr_scheduler(zero_opt)

    reporter = Reporter(tel)
    engine_class: type[ZeroEngine] = ZeroEngine
    extra: dict[str, Any] = {}
    if parallel is not None:
        engine_class, extra = parallel.engine_class(), {"parallel": parallel}
    engine = engine_class(
        **extra,
        module=model,
        config=cfg,
        raw_config=raw,
        strategy=strategy,
        optimizer=zero_opt,
        lr_scheduler=scheduler,
        comm=comm,
        reporter=reporter,
        scaler=make_loss_scaler(cfg.precision, cfg.fp16),
        device=device,
    )
    # After the engine: a model-parallel engine has told the agent its layout by now, so the
    # one Hello carries it.
    layers = reporter.watch_blocks(model)
    psi, padded = strategy.param_counts()
    reporter.hello(
        cfg=cfg,
        dp_world_size=comm.world_size,
        optimizer=zero_opt.name,
        total=total,
        psi=psi,
        padded=padded,
        largest=largest,
        persistent=getattr(strategy, "persistent_numel", 0),
        device=device,
        layers=layers,
        built=built,
    )
    if training_data is not None and hasattr(engine, "set_training_data"):  # a pipeline
        engine.set_training_data(training_data, collate_fn)
    elif training_data is not None:
        engine.training_dataloader = training_loader(
            training_data, cfg, rank=comm.rank, world_size=comm.world_size, collate_fn=collate_fn
        )
    return engine, zero_opt, engine.training_dataloader, scheduler
