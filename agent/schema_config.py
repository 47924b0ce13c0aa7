"""What a rank's Hello says of its job: the engine's configuration, its parameter counts and
its place in a 3D-parallel layout. Part of the wire schema (agent/schema.py re-exports every
name here; import them from there): split out only to keep that module small.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Precision = Literal["fp32", "bf16", "fp16"]
OffloadDevice = Literal["none", "cpu", "nvme"]


class ConfigSummary(msgspec.Struct, omit_defaults=True):
    """What a viewer needs to predict this rank's memory and traffic with the ZeRO formulas."""

    stage: int
    precision: Precision
    dp_world_size: int
    offload_optimizer: OffloadDevice = "none"
    offload_param: OffloadDevice = "none"
    overlap_comm: bool = False
    micro_batch_size: int = 1
    gradient_accumulation_steps: int = 1
    train_batch_size: int = 1
    gradient_clipping: float = 0.0
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    prefetch_bucket_size: int = 50_000_000
    param_persistence_threshold: int = 100_000
    max_live_parameters: int = 1_000_000_000
    max_reuse_distance: int = 1_000_000_000
    optimizer: str = "AdamW"
    loss_scale_window: int = 1000
    min_loss_scale: float = 1.0
    # Optional, for the advisor (zeroscope/state/advice); defaults are DeepSpeed's.
    hysteresis: int = 2
    initial_scale_power: int = 16
    offload_pin_memory: bool = True
    """``offload_optimizer.pin_memory`` (page-locked host buffers for the offload copies)."""
    gather_16bit_weights_on_model_save: bool = False
    """``stage3_gather_16bit_weights_on_model_save``."""
    contiguous_gradients: bool = True
    grad_buckets_separate: bool = False
    """The engine reduces gradients through bucket buffers of its own, beside the ``.grad``
    tensors (DDP without ``gradient_as_bucket_view``): G holds the trainable gradients twice."""
    grads_all_reduced: bool = False
    """Stages 1-2 reduce gradients with all-reduces of the whole flat buffer (DeepSpeed's
    ZeRO-1/2 optimizer), not reduce-scatters of it (the bundled engine): 2Ψ a reduction."""
    fp32_master_copy: bool = False
    """The engine's optimizer keeps an fp32 copy of its partition even when the model is fp32
    (DeepSpeed's ZeRO optimizers clone it): O is 12 bytes a trainable parameter, not the 8 of
    Adam's moments beside parameters that are their own master."""
    grad_bucket_bytes: int = 0
    """Bytes of reduce buckets the engine holds on the device for the whole run, beside the
    gradients (DeepSpeed ZeRO-3 allocates its ``reduce_bucket_size``-element bucket when the
    engine is built): part of G however small the model. The prediction adds them."""
    held_precision: Precision | None = None
    """The dtype the engine keeps its parameters, their gradients and the optimizer's master in
    between steps, where it differs from ``precision`` (the one it computes and gathers in):
    FSDP2 with a ``MixedPrecisionPolicy`` keeps the sharded parameters in their own dtype and
    casts only what it gathers. The memory prediction takes this one; None: ``precision``."""
    no_master_copy: bool = False
    """The optimizer steps the parameters the engine holds (FSDP2: the sharded parameters, on
    the host under its CPU offload): no fp32 master copy beside them, even under offload,
    where DeepSpeed's CPU optimizer keeps one. O is the optimizer's state alone."""
    optimizer_slots: int = -1
    """Parameter-sized tensors the optimizer keeps per parameter (SGD with momentum 1, Adam 2,
    with amsgrad 3: agent/attach/optimizer_slots.py); -1: not known, the prediction takes
    Adam's. Used where the optimizer steps the held parameters (``no_master_copy``)."""
    optimizer_state_elements: int = 0
    """Where the loop steps its parameters with more than one optimizer (matrices with one, the
    rest with another), the parameter-sized state elements they keep in all: each group's
    slots (as ``optimizer_slots``) x the elements it steps; 0: one optimizer (its slots hold)
    or some optimizer's slots unknown. The prediction of O takes it over the slots."""
    params_sharded_at_step: bool = False
    """Stage 2 whose parameters are sharded again at the step (FSDP2 with
    ``reshard_after_forward=False`` reshards after backward): P is the shard, not the paper's
    stage-2 replica; only forward-to-backward holds them whole (a peak, not model state)."""
    grad_elements_held: int = 0
    """This rank's gradient elements at the step, where the engine keeps more or less than the
    formula's shard (0: the formula holds). DeepSpeed ZeRO-1/2 keep the *whole* gradient of
    every parameter overlapping the rank's slice of the flat buffer (``params_in_partition``),
    and stage 1 a zero block for the padding in it: per rank, from the engine's layout; the
    Memory screen predicts each rank's G from it."""
    grads_freed_under_offload: bool = False
    """Stage 1 under optimizer offload keeps no gradients on the device at the step (DeepSpeed:
    each reduced partition goes to the host's fp32 ``.grad`` and the device gradients are
    freed, as at stage 2): device G is 0 there, not the paper's stage-1 2Ψ."""
    host_grad_copy_bytes: int = 0
    """Bytes per element of a second host gradient partition the engine keeps beside the fp32
    one its host optimizer steps (0: none). DeepSpeed ZeRO-3 under ``offload_optimizer: cpu``
    reduces each shard into ``grad_partitions_flat_buffer`` (the gradient-accumulation dtype,
    the model's by default) and copies it into the fp32 partition's ``.grad``, both held for
    the whole run: host G is (this + 4) bytes a trainable parameter over N, not 4."""
    grad_accum_bytes: int = 0
    """Bytes per element of whole gradient-accumulation buffers the engine keeps beside the
    model's own gradients, over every padded parameter on every rank (0: none). DeepSpeed's
    ``BF16_Optimizer`` (bf16 at ZeRO-1 with ``"data_types": {"grad_accum_dtype": "fp32"}``)
    accumulates into fp32 flat buffers the size of its bf16 groups: G is 4 bytes a padded
    parameter plus the bf16 gradients, not the paper's 2 (on bf16 pipeline stages, with no
    ``grad_accum_dtype`` set, the buffers are bf16: 2)."""


class ParamCounts(msgspec.Struct, omit_defaults=True):
    """Parameter element counts (Psi and friends) as the engine sees them."""

    total: int
    """Psi: every parameter element of the model (tied weights counted once)."""
    trainable: int
    persistent: int = 0
    """Stage 3: elements never sharded (numel <= stage3_param_persistence_threshold)."""
    padded_total: int = 0
    """Elements after padding each flat buffer to a multiple of the DP world size."""
    largest_layer: int = 0
    layers: int = 0
    """Repeated blocks (the longest list of same-class modules, e.g. transformer layers) whose
    activation bytes ``MemoryBytes.activations_in_layers`` splits out; 0 = not said."""
    zero_init: bool | None = None
    """Stage 3: the parameters came partitioned at construction (``zero.Init``); None = not
    said."""
    built_bytes: int = 0
    """Bytes of the parameters as handed to the engine, before any cast or partition: what the
    rank held whole at start-up (0 = not said)."""

    @property
    def frozen(self) -> int:
        """Elements of frozen parameters (``requires_grad=False``, or left out of the
        optimizer): held like the others (in P) but with no gradient or optimizer state."""
        return max(self.total - self.trainable, 0)


class ParallelLayout(msgspec.Struct, omit_defaults=True):
    """A rank's place in a 3D-parallel job (tensor x data x pipeline) and, with a pipeline, the
    schedule it runs. Sent once (in Hello); absent for plain data parallelism."""

    dp: int = 0
    pp: int = 0
    tp: int = 0
    dp_size: int = 1
    pp_size: int = 1
    tp_size: int = 1
    schedule: str = ""
    """torch.distributed.pipelining schedule class, e.g. ``Schedule1F1B`` ("" = no pipeline)."""
    microbatches: int = 0
    num_stages: int = 0
    """Pipeline stages in all (more than pp_size with interleaved / virtual stages)."""
    stages: list[int] = msgspec.field(default_factory=list)
    """The stage indices this rank runs."""
    parts: list[int] = msgspec.field(default_factory=list)
    """Layer boundaries: stage s holds layers ``parts[s] <= i < parts[s + 1]``."""
    plan: list[str] = msgspec.field(default_factory=list)
    """The schedule's own plan for this rank (``pipeline_order``), compute actions in order as
    ``"<stage><F|B|I|W><microbatch>"``; empty when torch's plan is incomplete."""
