"""Every private or undocumented name the attach reads from engines it does not own (FSDP2,
DeepSpeed, the HF Trainer; DDP's are in tests/test_attach_drift.py's live drifts).

These names have no stability promise: a torch or DeepSpeed release may rename one, and a
reader that meets a renamed attribute through ``getattr(obj, name, default)`` would report a
figure that is silently wrong (a gradient bucket counted as empty). So the names are listed
here, in one place, and checked twice:

- when an engine is found (:func:`missing`, called by the session once per engine): a name
  gone from the live object turns that engine's memory accounting off, said once (console and
  Log screen); its P/G/O then read NA, never a partial count;
- by tests/test_attach_private_api.py on the installed torch, DeepSpeed and transformers, on
  real engines of each kind, and against the readers' source (a private read the readers make
  that is not listed here fails that test): an upgrade that moved one fails a test, loudly.

Class members are resolved on import (``CLASS_MEMBERS``); instance attributes are looked up on
the live object (``INSTANCE``). Names only some configurations create (CPU offload's buffers)
are not listed as required: the readers treat them as absent-means-none by DeepSpeed's rule.
"""

from __future__ import annotations

import importlib
from typing import Any

CLASS_MEMBERS: dict[str, dict[str, tuple[str, ...]]] = {
    "torch.distributed.fsdp._fully_shard._fsdp_state": {
        "FSDPState": ("_pre_forward", "_post_forward"),
    },
    "torch.distributed.fsdp._fully_shard._fully_shard": {
        # A compiled FSDP2 root is found from its module, outside the compiled region.
        "FSDPModule": ("_get_fsdp_state",),
    },
    "torch.distributed.fsdp._fully_shard._fsdp_param_group": {
        "FSDPParamGroup": ("unshard", "post_backward"),
    },
    "torch.distributed.device_mesh": {
        # agent/attach/device_mesh.py: meshes that get new groups after __init__.
        "DeviceMesh": ("_unflatten",),
    },
    "torch.distributed.pipelining.schedules": {
        # Every schedule computes its micro-batches' losses here (agent/attach/pipeline_loss.py).
        "_PipelineSchedule": ("_compute_loss",),
    },
    "deepspeed": {
        "DeepSpeedEngine": (
            "__init__",
            "forward",
            "backward",
            "step",
            "load_checkpoint",
            "_get_optimizer_loss_scale",
            "is_gradient_accumulation_boundary",
            "get_global_grad_norm",
            "zero_reduce_bucket_size",
            "zero_allgather_bucket_size",
            "zero_prefetch_bucket_size",
            "zero_param_persistence_threshold",
            "zero_max_live_parameters",
            "zero_max_reuse_distance",
            "zero_offload_optimizer",
            "zero_offload_param",
            "zero_overlap_comm",
        ),
    },
    "deepspeed.runtime.pipe.engine": {
        # agent/attach/deepspeed_pipe.py: the step, and the schedule's instruction table.
        "PipelineEngine": (
            "train_batch",
            "_exec_optimizer_step",
            "_exec_backward_pass",
            "_INSTRUCTION_MAP",
            "is_first_stage",
        ),
    },
    "transformers.trainer": {"Trainer": ("__init__", "training_step", "add_callback", "evaluate")},
    "transformers.trainer_callback": {
        # The events the attach's callback relies on: a release that stopped calling them
        # would leave the optimizer phase (and the step ends) unseen.
        "CallbackHandler": ("on_pre_optimizer_step", "on_optimizer_step", "on_step_end"),
    },
}
"""module -> class -> members the attach wraps or calls."""

INSTANCE: dict[str, tuple[str, ...]] = {
    "fsdp2.state": ("_is_root", "_state_ctx", "_fsdp_param_groups", "_device"),
    "fsdp2.state_ctx": ("all_states",),
    "fsdp2.param_group": ("fsdp_params", "post_forward_mesh_info", "_module_fqn"),
    "fsdp2.param": (
        "_sharded_param_data",
        "_orig_size",
        "sharded_param",
        "mp_policy",
        "orig_dtype",
        "offload_to_cpu",
        "mesh_info",
        "sharded_state",
        "all_gather_outputs",
    ),
    "deepspeed.engine": (
        "_config",
        "optimizer",
        "module",
        "dp_world_size",
        "global_steps",
        "skipped_steps",
        "device",
    ),
    "deepspeed.zero12": (
        "bit16_groups_flat",
        "averaged_gradients",
        "ipg_buckets",
        "single_partition_of_fp32_groups",
        "optimizer",
        "loss_scaler",
    ),
    "deepspeed.bf16": (
        "bf16_groups",
        "bf16_groups_flat",
        "fp32_groups_flat_partition",
        "fp32_groups_gradients_flat",
        "optimizer",
    ),
    "deepspeed.zero3": (
        "ipg_buckets",
        "grad_partitions_flat_buffer",
        "fp32_partitioned_groups_flat",
        "fp16_partitioned_groups_flat",
        "optimizer",
        "loss_scaler",
    ),
    "deepspeed.zero3_param": ("ds_tensor", "ds_persist", "ds_status", "ds_numel"),
    "deepspeed.ipg_bucket": ("buffer",),
}
"""kind of object -> attributes the readers read on it."""

OPTIONAL: frozenset[str] = frozenset(
    {
        "grads_in_partition",  # ZeRO-1/2: created at the first reduction
        "accumulated_grads_in_cpu",  # ZeRO-1/2 with CPU offload only
        "fp32_groups_flat",  # the stage-0 fp16 optimizer; fp32_groups for the unfused one
        "fp32_groups",
        "bit16_groups",
        "fp16_groups",
        "cur_scale",
        "min_scale",  # a loss scaler's floor (fp16 only)
        "value",  # an offload device enum's name
        "state",  # a torch optimizer's per-parameter state
        "param_dtype",  # FSDP2's MixedPrecisionPolicy (public): None = the parameters' dtype
        "model",  # the HF Trainer's (public): None until it has one
        "global_step",  # the HF TrainerState's (public): its count, resumed or 0
        "_dynamo_disable",  # FSDP2's hooks' Dynamo opt-out: the wrappers copy it where it exists
        # DeepSpeed's layout, read for the prediction only (agent/attach/deepspeed_engine.py):
        # without one the prediction keeps the paper's figure, the counts are untouched, and
        # tests/test_attach_deepspeed.py fails on the figure the Hello no longer carries.
        "params_in_partition",
        "groups_padding",
        "partition_gradients",
        "cpu_offload",
        "use_separate_grad_accum",
        "offload_optimizer",
        "swap_optimizer",
    }
)
"""Names the readers read with a default on purpose: absent in some configurations, where the
default (none held) is DeepSpeed's or torch's own meaning."""


def class_members() -> list[str]:
    """``module:Class.member`` for every listed class member the installed packages lack (a
    package not installed is skipped: the attach never installs for it)."""
    gone: list[str] = []
    for module_name, classes in CLASS_MEMBERS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for cls_name, members in classes.items():
            cls = getattr(module, cls_name, None)
            if cls is None:
                gone.append(f"{module_name}:{cls_name}")
                continue
            gone += [f"{module_name}:{cls_name}.{m}" for m in members if not hasattr(cls, m)]
    return gone


def missing(obj: Any, kind: str) -> list[str]:
    """The listed attributes of ``kind`` that ``obj`` lacks (``kind.name`` each)."""
    return [f"{kind}.{name}" for name in INSTANCE[kind] if not hasattr(obj, name)]
