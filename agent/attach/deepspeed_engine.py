"""DeepSpeed (the real one): memory, steps and loss-scale events from the engine's own state.

Found when a ``DeepSpeedEngine`` is built (its ``__init__`` is wrapped at class level; HF
Trainer/Accelerate build it the same way). ``forward``, ``backward`` and ``step`` are wrapped
too: phases, the micro-batch losses given to ``backward``, and the step boundary, which is a
``step()`` call that advanced ``global_steps`` (an accumulation boundary).

Per step, from DeepSpeed's own counters: ``skipped_steps`` advancing = overflow, step skipped;
the optimizer's ``cur_scale`` before and after = ``scale_change``; an overflow at
``loss_scaler.min_scale`` = ``scale_at_minimum``; ``get_global_grad_norm()``; ``get_lr()``.

Memory, exact, from the tensors DeepSpeed holds (each storage once, :mod:`.census`):

- frozen parameters (``requires_grad=False``: a LoRA fine-tune's base model) are in P like the
  others, and reported apart as ``frozen_params``: whole in the module at stages 0-2 (DeepSpeed
  keeps them out of its flat groups, replicated), their ``ds_tensor`` shard at stage 3.
- stages 1 and 2 (``DeepSpeedZeroOptimizer``): P = the flat 16-bit groups
  (``bit16_groups_flat``, padded to a multiple of 2 x world) and the frozen parameters; G = the reduced gradients kept
  before the step (``averaged_gradients``, the ``ipg_buckets``' buffers, the fp32 partitions' ``.grad`` and
  ``accumulated_grads_in_cpu`` with CPU offload); O = the fp32 master partitions
  (``single_partition_of_fp32_groups``) and the inner optimizer's state.
- stage 3 (``DeepSpeedZeroOptimizer_Stage3``): P = the 16-bit partitions
  (``fp16_partitioned_groups_flat`` / each parameter's ``ds_tensor``) plus persistent
  parameters (``ds_persist``, also in ``persistent_params``); G = the reduce buckets
  (``ipg_buckets``, ``reduce_bucket_size`` elements each), ``grad_partitions_flat_buffer`` and
  the fp32 partitions' ``.grad``; O = ``fp32_partitioned_groups_flat`` and the optimizer
  state; ``gathered_params`` = full parameters gathered at the moment of the count.
- offload: what the config places on the host (``offload_optimizer``: O and the fp32 grads;
  ``offload_param``: P partitions) is counted in ``host_*`` instead.
"""

from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any

from zeroscope.agent.loss_scale import scale_text
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, OffloadDevice, ParamCounts

from . import patches
from .census import Census, tensors_in
from .private_api import missing
from .session import SESSION, EngineReader


def _device(offload: Any) -> OffloadDevice:
    """DeepSpeed's offload config (None or a model with ``.device``) as the schema's name."""
    device = getattr(offload, "device", None)
    name = str(getattr(device, "value", device) or "none").lower()
    return name if name in ("cpu", "nvme") else "none"


def _persistent(p: Any) -> bool:
    return bool(getattr(p, "ds_persist", False))


class DeepSpeedReader(EngineReader):
    kind = "deepspeed"
    priority = 30

    def __init__(self, engine: Any) -> None:
        self._engine = weakref.ref(engine)

    def alive(self) -> bool:
        return self._engine() is not None

    def _parts(self) -> tuple[Any, Any, int]:
        engine = self._engine()
        assert engine is not None
        return engine, engine.optimizer, int(engine.zero_optimization_stage())

    def hello(self) -> tuple[ConfigSummary, ParamCounts, str]:
        engine, opt, stage = self._parts()
        fp16 = engine._config.float16_config
        inner = getattr(opt, "optimizer", opt)
        config = ConfigSummary(
            stage=stage,
            precision="bf16"
            if engine.bfloat16_enabled()
            else "fp16"
            if engine.fp16_enabled()
            else "fp32",
            dp_world_size=int(engine.dp_world_size),
            offload_optimizer=_device(engine.zero_offload_optimizer()),
            offload_param=_device(engine.zero_offload_param()),
            overlap_comm=bool(engine.zero_overlap_comm()),
            micro_batch_size=int(engine.train_micro_batch_size_per_gpu()),
            gradient_accumulation_steps=int(engine.gradient_accumulation_steps()),
            train_batch_size=int(engine.train_batch_size()),
            gradient_clipping=float(engine.gradient_clipping() or 0.0),
            reduce_bucket_size=int(engine.zero_reduce_bucket_size()),
            allgather_bucket_size=int(engine.zero_allgather_bucket_size()),
            prefetch_bucket_size=int(engine.zero_prefetch_bucket_size()),
            param_persistence_threshold=int(engine.zero_param_persistence_threshold()),
            max_live_parameters=int(engine.zero_max_live_parameters()),
            max_reuse_distance=int(engine.zero_max_reuse_distance()),
            optimizer=type(inner).__name__,
            loss_scale_window=int(fp16.loss_scale_window),
            min_loss_scale=float(fp16.min_loss_scale),
            grad_bucket_bytes=_held_buckets(opt) if stage == 3 else 0,
            host_grad_copy_bytes=_host_grad_copy(opt) if stage == 3 else 0,
            grad_elements_held=_grad_elements_held(opt) if stage in (1, 2) else 0,
            grads_freed_under_offload=stage == 1 and bool(getattr(opt, "cpu_offload", False)),
            grad_accum_bytes=_grad_accum_bytes(opt),
            grads_all_reduced=stage in (1, 2),
            fp32_master_copy=stage >= 1
            and not engine.bfloat16_enabled()
            and not engine.fp16_enabled(),
        )
        params = list(engine.module.parameters())

        def numel(p: Any) -> int:
            return int(getattr(p, "ds_numel", p.numel()))

        if stage == 3:
            padded = sum(p.ds_tensor.numel() for p in params if hasattr(p, "ds_tensor"))
            padded *= int(engine.dp_world_size)
        else:
            flat = getattr(opt, "bit16_groups_flat", None) or getattr(opt, "bf16_groups_flat", [])
            padded = sum(t.numel() for t in flat)
        counts = ParamCounts(
            total=sum(numel(p) for p in params),
            trainable=sum(numel(p) for p in params if p.requires_grad),
            persistent=sum(numel(p) for p in params if _persistent(p)),
            padded_total=padded,
            largest_layer=max(
                (
                    sum(numel(p) for p in m.parameters(recurse=False))
                    for m in engine.module.modules()
                ),
                default=0,
            ),
        )
        return config, counts, str(engine.device)

    def _offload(self, engine: Any) -> tuple[bool, bool]:
        return (
            _device(engine.zero_offload_optimizer()) != "none",
            _device(engine.zero_offload_param()) != "none",
        )

    def count_grads(self, census: Census) -> None:
        engine, opt, stage = self._parts()
        off_opt, _ = self._offload(engine)
        if _bf16_optimizer(opt):
            # The whole accumulation buffers (fp32 under ``grad_accum_dtype: fp32``; the fp32
            # partition's ``.grad`` is a view of its slice at the step) and the bf16 gradients
            # autograd leaves on the parameters.
            census.add("grads", getattr(opt, "fp32_groups_gradients_flat", []))
            census.add("grads", (p.grad for g in getattr(opt, "bf16_groups", []) for p in g))
            return
        if stage == 3:
            # The reduce bucket (``reduce_bucket_size`` elements) stays on the device; the
            # partitioned gradients live where the optimizer steps (stage3.py: self.device).
            buckets = getattr(opt, "ipg_buckets", {}) or {}
            census.add("grads", (getattr(b, "buffer", None) for b in buckets.values()))
            flat = getattr(opt, "grad_partitions_flat_buffer", None)
            census.add("grads", [flat], host=off_opt)
            fp32 = getattr(opt, "fp32_partitioned_groups_flat", [])
        elif stage in (1, 2):
            census.add("grads", tensors_in(getattr(opt, "averaged_gradients", {})))
            # The reduce buckets (one per communication dtype, each a list of buffers while a
            # backward fills them; DeepSpeed frees them at the backward's end).
            buckets = getattr(opt, "ipg_buckets", {}) or {}
            census.add("grads", (t for b in buckets.values() for t in tensors_in(b.buffer)))
            census.add("grads", [getattr(opt, "grads_in_partition", None)])
            census.add("grads", tensors_in(getattr(opt, "accumulated_grads_in_cpu", {})), host=True)
            fp32 = getattr(opt, "single_partition_of_fp32_groups", [])
        else:  # stage 0: the module's own gradients
            census.add("grads", (p.grad for p in engine.module.parameters()))
            return
        census.add("grads", (t.grad for t in fp32), host=off_opt)

    def count_state(self, census: Census) -> None:
        engine, opt, stage = self._parts()
        off_opt, off_param = self._offload(engine)
        inner = getattr(opt, "optimizer", None)
        if inner is None and stage == 0:  # fp32 at stage 0: the torch optimizer, unwrapped
            inner = opt
        params = list(engine.module.parameters())
        frozen = [p for p in params if not p.requires_grad]
        if _bf16_optimizer(opt):  # the parameters are views of its flat bf16 groups
            census.add("params", getattr(opt, "bf16_groups_flat", []))
            census.add("params", (p.data for p in frozen), frozen=True)
            census.add("optim", getattr(opt, "fp32_groups_flat_partition", []), host=off_opt)
        elif stage == 3:
            trainable = [p for p in params if p.requires_grad]
            census.add("params", (p.data for p in trainable if _persistent(p)))
            census.add("params", getattr(opt, "fp16_partitioned_groups_flat", []), host=off_param)
            census.add("params", (getattr(p, "ds_tensor", None) for p in trainable), host=off_param)
            # Frozen parameters are partitioned too (each its own ds_tensor, outside the flat
            # groups), and the persistent ones kept whole beside it.
            census.add("params", (p.data for p in frozen if _persistent(p)), frozen=True)
            shards = (getattr(p, "ds_tensor", None) for p in frozen)
            census.add("params", shards, host=off_param, frozen=True)
            census.add("optim", getattr(opt, "fp32_partitioned_groups_flat", []), host=off_opt)
        elif stage in (1, 2):
            census.add("params", getattr(opt, "bit16_groups_flat", []))
            # Frozen parameters stay whole in the module on every rank, outside the flat groups.
            census.add("params", (p.data for p in frozen), frozen=True)
            census.add("optim", getattr(opt, "single_partition_of_fp32_groups", []), host=off_opt)
        else:
            census.add("params", (p.data for p in frozen), frozen=True)
            census.add("params", engine.module.parameters())
            fp32 = getattr(opt, "fp32_groups_flat", None) or getattr(opt, "fp32_groups", None)
            census.add("optim", tensors_in(fp32 or []))
        if inner is not None:
            census.add("optim", tensors_in(getattr(inner, "state", {})), host=off_opt)

    def private_missing(self) -> list[str]:
        engine = self._engine()
        if engine is None:
            return []
        gone = missing(engine, "deepspeed.engine")
        if gone:
            return gone
        _, opt, stage = self._parts()
        if _bf16_optimizer(opt):
            gone += missing(opt, "deepspeed.bf16")
        elif stage == 3:
            gone += missing(opt, "deepspeed.zero3")
            for p in engine.module.parameters():
                gone += missing(p, "deepspeed.zero3_param")
        elif stage in (1, 2):
            gone += missing(opt, "deepspeed.zero12")
        for bucket in (getattr(opt, "ipg_buckets", None) or {}).values():
            gone += missing(bucket, "deepspeed.ipg_bucket")
        return sorted(set(gone))

    def layout(self) -> Any:
        _, opt, _ = self._parts()
        return len(getattr(getattr(opt, "optimizer", opt), "state", ()))

    def memory_extras(self, memory: MemoryBytes) -> None:
        engine, _, stage = self._parts()
        if stage != 3:
            return
        persistent = gathered = 0
        for p in engine.module.parameters():
            if _persistent(p):
                persistent += p.data.nbytes
            elif p.data.numel() and str(getattr(p, "ds_status", "")).endswith("AVAILABLE"):
                gathered += p.data.nbytes
        memory.persistent_params = persistent
        memory.gathered_params = gathered


def _bf16_optimizer(opt: Any) -> bool:
    """DeepSpeed's ``BF16_Optimizer``: bf16 at ZeRO-1 with ``"data_types": {"grad_accum_dtype":
    "fp32"}`` (and bf16 pipeline stages at ZeRO-0), its own layout: flat bf16 groups the
    parameters view (P), whole gradient-accumulation buffers (fp32 as configured; bf16 on
    pipeline stages without ``grad_accum_dtype``) beside the bf16 gradients (G), fp32 master
    partitions (O)."""
    return hasattr(opt, "bf16_groups_flat") and hasattr(opt, "fp32_groups_flat_partition")


def _grad_accum_bytes(opt: Any) -> int:
    """Bytes per element of ``BF16_Optimizer``'s whole accumulation buffers (0 for any other
    optimizer): a layout fact the Hello carries for the prediction."""
    if not _bf16_optimizer(opt):
        return 0
    flat = getattr(opt, "fp32_groups_gradients_flat", None) or []
    return int(flat[0].element_size()) if flat else 0


def _grad_elements_held(opt: Any) -> int:
    """ZeRO-1/2's gradient elements on this rank at the step, from its partition layout: the
    whole gradients of the parameters overlapping its slice (``params_in_partition``), plus at
    stage 1 the padding in its slice (a zero block). 0 (the formula) under optimizer offload,
    or with a separate gradient-accumulation dtype, whose buffers are laid out otherwise."""
    groups = getattr(opt, "params_in_partition", None)
    if (
        not groups
        or getattr(opt, "cpu_offload", True)
        or getattr(opt, "use_separate_grad_accum", True)
    ):
        return 0
    held = sum(int(p.numel()) for group in groups for p in group)
    if not getattr(opt, "partition_gradients", True):  # stage 1
        held += sum(int(n) for n in getattr(opt, "groups_padding", ()))
    return held


def _host_grad_copy(opt: Any) -> int:
    """Bytes per element of ZeRO-3's host gradient buffer under CPU optimizer offload (the
    shards reduced into it, then copied into the fp32 partition's ``.grad``): its dtype, a
    layout fact the Hello carries for the prediction (0 without offload, where it is on the
    device, or under NVMe offload, where the fp32 ``.grad`` is swapped out)."""
    if not getattr(opt, "offload_optimizer", False) or getattr(opt, "swap_optimizer", True):
        return 0
    flat = getattr(opt, "grad_partitions_flat_buffer", None)
    return 0 if flat is None else int(flat.element_size())


def _held_buckets(opt: Any) -> int:
    """Bytes of ZeRO-3's reduce buckets (``ipg_buckets``: one ``reduce_bucket_size``-element
    buffer per gradient dtype, allocated with the optimizer and kept; stages 1 and 2 make
    theirs during each backward and free them at its end)."""
    total = 0
    for bucket in (getattr(opt, "ipg_buckets", None) or {}).values():
        buffer = getattr(bucket, "buffer", None)
        if buffer is not None:
            total += int(buffer.numel() * buffer.element_size())
    return total


def _loss_scale(engine: Any) -> float | None:
    if not engine.fp16_enabled():
        return None
    try:
        scale = engine._get_optimizer_loss_scale()
        return None if scale is None else float(scale)
    except Exception:
        return None


def _min_scale(engine: Any) -> float | None:
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    value = getattr(scaler, "min_scale", None)
    return None if value is None else float(value)


def install(module: ModuleType) -> None:
    """Wrap ``DeepSpeedEngine`` (``module`` is the imported ``deepspeed`` package)."""
    engine_cls = module.DeepSpeedEngine
    init, forward, backward, step = (
        engine_cls.__init__,
        engine_cls.forward,
        engine_cls.backward,
        engine_cls.step,
    )
    load: Any = getattr(engine_cls, "load_checkpoint", None)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        s = SESSION
        s.building += 1
        try:
            init(self, *args, **kwargs)
        finally:
            s.building -= 1
        if not s.passive:
            s.claim_source("deepspeed")
            s.found(DeepSpeedReader(self))

    def forward_(self: Any, *inputs: Any, **kwargs: Any) -> Any:
        with SESSION.phase("forward"):
            SESSION.model_inputs(self.module, inputs, kwargs)
            return forward(self, *inputs, **kwargs)

    def backward_(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        s = SESSION
        # With scale_wrt_gas=False (HF Trainer, Accelerate) the caller divided by the
        # accumulation steps itself: the step's loss is still the mean of the unscaled ones.
        scaled = kwargs.get("scale_wrt_gas", args[1] if len(args) > 1 else True)
        s.add_loss(loss, 1.0 if scaled else float(self.gradient_accumulation_steps()))
        with s.phase("backward"):
            return backward(self, loss, *args, **kwargs)

    def step_(self: Any, *args: Any, **kwargs: Any) -> Any:
        s = SESSION
        if not s.drives("deepspeed"):
            return step(self, *args, **kwargs)
        lr = None
        try:
            steps, skipped = self.global_steps, self.skipped_steps
            scale = _loss_scale(self)
            if self.is_gradient_accumulation_boundary():
                # The lr this step's update uses: step() moves DeepSpeed's scheduler on after
                # it (the bundled engine reports the same: the step's own lr).
                lr = self.get_lr()
                s.before_step("deepspeed")
        except Exception:
            s.errors += 1
            return step(self, *args, **kwargs)
        with s.phase("optimizer"):
            out = step(self, *args, **kwargs)
        if self.global_steps != steps:
            _step_end(self, skipped, scale, lr)
        return out

    def load_checkpoint_(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = load(self, *args, **kwargs)
        s = SESSION
        if s.drives("deepspeed"):
            # A resumed run: its steps are numbered as DeepSpeed numbers them (global_steps
            # 21, 22, ... after a checkpoint of step 20), not from 1 again.
            try:
                s.number_steps_from(int(self.global_steps) + 1)
            except Exception:
                s.errors += 1
        return out

    __init__.__doc__ = init.__doc__
    forward_.__doc__ = forward.__doc__
    backward_.__doc__ = backward.__doc__
    step_.__doc__ = step.__doc__
    patches.replace(engine_cls, "__init__", __init__)
    patches.replace(engine_cls, "forward", forward_)
    patches.replace(engine_cls, "backward", backward_)
    patches.replace(engine_cls, "step", step_)
    if load is not None:
        load_checkpoint_.__doc__ = load.__doc__
        patches.replace(engine_cls, "load_checkpoint", load_checkpoint_)
    from .deepspeed_pipe import install_pipeline
    from .install import guarded

    # Its own part: a DeepSpeed whose pipeline engine moved leaves the other engines attached.
    guarded("DeepSpeed's pipeline engine (train_batch)", lambda: install_pipeline(module))


def _step_end(
    engine: Any,
    skipped_before: int,
    scale_before: float | None,
    lr: list[float] | None,
    samples: int | None = None,
    **figures: Any,
) -> None:
    """Report the step DeepSpeed just took; ``samples``: this rank's share of the step's
    samples (its micro-batches by default), ``figures``: what the caller knows better (a
    pipeline's loss)."""
    s = SESSION
    try:
        skipped = engine.skipped_steps != skipped_before
        scale = _loss_scale(engine)
        if skipped:
            at = scale_before if scale_before is not None else 0.0
            said = scale_text(at)
            s.event("overflow", f"gradient overflow at loss scale {said}: step skipped", at)
            minimum = _min_scale(engine)
            if scale is not None and minimum is not None and scale_before == scale == minimum:
                said = scale_text(scale)
                s.event("scale_at_minimum", f"overflow with the loss scale at {said}", scale)
        if scale is not None and scale_before is not None and scale != scale_before:
            change = f"{scale_text(scale_before)} -> {scale_text(scale)}"
            s.event("scale_change", f"loss scale {change}", scale)
        s.end_step(
            "deepspeed",
            lr=float(lr[0]) if lr else None,
            grad_norm=engine.get_global_grad_norm(),
            loss_scale=scale,
            overflow=skipped,
            skipped=skipped,
            samples=int(engine.train_micro_batch_size_per_gpu())
            * int(engine.gradient_accumulation_steps())
            if samples is None
            else samples,
            **figures,
        )
    except Exception:
        s.errors += 1
