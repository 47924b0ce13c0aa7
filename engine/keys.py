"""Every DeepSpeed ds_config key and API name, with what the engine does with it, read from the
code itself: the config dataclasses and their ``ALIASES`` / ``KEYS`` tables (engine/config*.py),
the DeepSpeed surface package (engine/deepspeed/) and the engine class.

    python -m zeroscope.engine.keys --markdown     # the tables in docs/engine.md

``tests/test_deepspeed_keys.py`` checks that docs/engine.md holds exactly this output and that
every key DeepSpeed 0.19.8's config reader looks up, and every public member of its engine
class, is listed here.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import typing
from dataclasses import dataclass
from typing import Any

from .config import DeepSpeedConfig
from .config_blocks import _LEGACY_FUSION, _SCHEDULERS, _UNSUPPORTED_SCHEDULERS, AdamParams
from .config_parse import Deprecated, Ignored, Refused, key_fields

IMPLEMENTED = "implemented"
IGNORED = "accepted, ignored"
REFUSED = "refused unless off"
ALIAS = "alias"
DEPRECATED = "deprecated alias"
NOT_BUILT = "not built"


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    status: str
    why: str = ""


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        return f"default {f.default!r}"
    return "a block" if f.default_factory is not dataclasses.MISSING else "required"


def _block_rows(cls: type, prefix: str) -> list[Row]:
    rows: list[Row] = []
    hints = typing.get_type_hints(cls)
    for f in key_fields(cls):
        path = f"{prefix}{f.name}"
        hint = hints[f.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            rows.append(Row(path, IMPLEMENTED, "a block"))
            rows += _block_rows(hint, f"{path}.")
        elif reason := f.metadata.get("ignored"):
            rows.append(Row(path, IGNORED, reason))
        elif reason := f.metadata.get("refused"):
            rows.append(Row(path, REFUSED, f"{reason} (accepted: {f.default!r})"))
        else:
            rows.append(Row(path, IMPLEMENTED, _default(f)))
    for alias, target in getattr(cls, "ALIASES", {}).items():
        rows.append(Row(f"{prefix}{alias}", ALIAS, f"of {prefix}{target}"))
    for key, status in getattr(cls, "KEYS", {}).items():
        path = f"{prefix}{key}"
        if isinstance(status, Ignored):
            rows.append(Row(path, IGNORED, status.reason))
        elif isinstance(status, Refused):
            rows.append(Row(path, REFUSED, status.reason))
        elif isinstance(status, Deprecated):
            rows.append(Row(path, DEPRECATED, f"rewritten onto {prefix}{status.new_key}"))
    return rows


def config_rows() -> list[Row]:
    """Every ds_config key the engine knows, with its status, sorted by key."""
    rows = _block_rows(DeepSpeedConfig, "")
    rows = [r for r in rows if r.name not in ("optimizer", "scheduler")]
    rows += [
        Row("optimizer", IMPLEMENTED, "a block"),
        Row("optimizer.type", IMPLEMENTED, "Adam, AdamW (case-insensitive); others refused"),
        Row("optimizer.params", IMPLEMENTED, "a block"),
        Row("optimizer.legacy_fusion", IGNORED, _LEGACY_FUSION.reason),
        *_block_rows(AdamParams, "optimizer.params."),
        Row("scheduler", IMPLEMENTED, "a block"),
        Row(
            "scheduler.type",
            IMPLEMENTED,
            f"{', '.join(_SCHEDULERS)}; refused: {', '.join(_UNSUPPORTED_SCHEDULERS)}",
        ),
        Row("scheduler.params", IMPLEMENTED, "a block (per type)"),
    ]
    seen: set[str] = set()
    for params in _SCHEDULERS.values():
        for row in _block_rows(params, "scheduler.params."):
            if row.name not in seen:
                seen.add(row.name)
                rows.append(Row(row.name, row.status, "" if row.status == IMPLEMENTED else row.why))
    return sorted(rows, key=lambda r: r.name)


# -- API names ----------------------------------------------------------------------------------

SURFACE_MODULES = {
    "deepspeed": "zeroscope.engine.deepspeed",
    "deepspeed.comm": "zeroscope.engine.deepspeed.comm",
    "deepspeed.zero": "zeroscope.engine.deepspeed.runtime.zero",
    "deepspeed.runtime.zero.partition_parameters": (
        "zeroscope.engine.deepspeed.runtime.zero.partition_parameters"
    ),
    "deepspeed.runtime.lr_schedules": "zeroscope.engine.deepspeed.runtime.lr_schedules",
    "deepspeed.runtime.engine": "zeroscope.engine.deepspeed.runtime.engine",
    "deepspeed.utils": "zeroscope.engine.deepspeed.utils",
    "deepspeed.utils.zero_to_fp32": "zeroscope.engine.deepspeed.utils.zero_to_fp32",
    "deepspeed.checkpoint.utils": "zeroscope.engine.deepspeed.checkpoint.utils",
    "deepspeed.accelerator": "zeroscope.engine.deepspeed.accelerator",
    "deepspeed.ops.adam": "zeroscope.engine.deepspeed.ops.adam",
    "deepspeed.checkpointing": "zeroscope.engine.checkpointing",
}
"""DeepSpeed module -> the engine module that serves it (its public names are implemented)."""

NOT_BUILT_MODULES = {
    "deepspeed.pipe": "pipeline parallelism (PipelineModule) is not built here",
    "deepspeed.ops (but ops.adam)": "DeepSpeed's fused and CPU kernels (Lion, Adagrad, Lamb, "
    "...); the engine steps Adam(W) only",
    "deepspeed.moe": "mixture-of-experts layers and expert parallelism",
    "deepspeed.inference / init_inference": "DeepSpeed's inference engine",
    "deepspeed.tp_model_init": "tensor parallelism",
    "deepspeed.profiling": "DeepSpeed's FLOPs profiler (zeroscope profiles the run itself)",
    "deepspeed.monitor": "DeepSpeed's metric writers (zeroscope records the run itself)",
    "deepspeed.compression / sequence / autotuning / elasticity": "not built",
}

ENGINE_ATTRIBUTES = {
    "module": "the wrapped model",
    "optimizer": "the engine's optimizer (param groups, lr, overflow)",
    "lr_scheduler": "the schedule stepped after each applied step",
    "config": "the ds_config as a dict",
    "device": "the rank's device",
    "global_steps": "applied + skipped optimizer steps",
    "global_samples": "samples over all ranks",
    "skipped_steps": "steps skipped for inf/NaN gradients",
    "micro_steps": "micro-batches seen",
    "training_dataloader": "the loader initialize(training_data=...) built",
}
"""DeepSpeed engine attributes that are instance attributes here (not visible on the class)."""

ENGINE_DIFFERENT = {
    "loss_scale": "a property: the current loss scale (DeepSpeed: a method returning the "
    "configured static scale)",
}

ENGINE_NOT_BUILT: dict[str, list[str]] = {
    "DeepSpeed's own profilers, timers and autotuner (zeroscope measures the run itself)": [
        "autotuning_end_profile_step",
        "autotuning_metric",
        "autotuning_metric_path",
        "autotuning_model_info_path",
        "autotuning_profile_model_info",
        "autotuning_start_profile_step",
        "flops_profiler_detailed",
        "flops_profiler_module_depth",
        "flops_profiler_output_file",
        "flops_profiler_profile_step",
        "flops_profiler_recompute_fwd_factor",
        "flops_profiler_top_modules",
        "get_wall_clock_timers",
        "print_forward_breakdown",
        "dump_state",
        "log_level",
        "collect_python_gc",
        "is_sanity_checks_enabled",
        "zero_log_trace_cache_warnings",
    ],
    "features that are not built (config keys refused unless off)": [
        "autotp_size",
        "bf16_master_weights_and_gradients",
        "bf16_optimizer_states",
        "curriculum_learning_config",
        "data_efficiency_config",
        "data_sampling_config",
        "data_sampling_enabled",
        "fp16_master_weights_and_gradients",
        "random_ltd_config",
        "random_ltd_initialize",
        "set_custom_curriculum_learning_schedule",
        "set_data_post_process_func",
        "tensor_parallel_config",
        "get_tensor_parallel_rank",
        "get_sequence_parallel_group",
        "torch_autocast_dtype",
        "torch_autocast_lower_precision_safe_modules",
        "zenflow_config",
        "load_moe_state_dict",
        "load_universal_checkpoint",
        "use_node_local_storage",
        "zero_hpz_partition_size",
        "super_offload",
        "cpuadam_cores_perc",
        "zero_partial_offload",
        "zero_save_muon_momentum_buffer_in_memory",
        "zero_multi_rank_bucket_allreduce",
        "zero_round_robin_gradients",
        "zero_parameter_alignment",
        "zero_allgather_sequential",
        "zero_module_granularity_threshold",
        "zero_compute_grad_norm",
        "optimizer_legacy_fusion",
    ],
    "DeepSpeed's compiler passes (engine.compile())": [
        "compile_autosp",
        "compile_autotp",
        "compile_zero_optimization_stage",
        "get_autosp_backend",
        "get_autotp_backend",
        "get_compile_time",
        "get_deepcompile_backend",
        "get_deepspeed_compile_backend",
        "is_compiled",
        "is_deepcompile_active",
        "is_deepcompile_enabled",
        "register_compile_pass",
        "uses_parallelization_pass_only",
    ],
    "DeepSpeed's internal reduction and checkpoint helpers (the engine has its own)": [
        "all_gather_scalar",
        "allreduce_and_copy",
        "allreduce_bucket",
        "allreduce_gradients",
        "allreduce_no_retain",
        "buffered_allreduce_fallback",
        "sparse_all_gather",
        "sparse_allreduce",
        "sparse_allreduce_bucket",
        "sparse_allreduce_no_retain",
        "coalesce_grad_reduction",
        "clip_fp32_gradients",
        "scale",
        "get_optimizer_configuration",
        "aio_config",
        "swap_tensor_config",
        "checkpoint_serialization_enabled",
        "checkpoint_tag_validation_enabled",
        "checkpoint_tag_validation_fail",
        "checkpoint_writer_enabled",
        "is_first_weights_partition_group",
        "is_iterable_style_dataset",
        "is_map_style_dataset",
        "load_module_state_dict",
        "empty_partition_cache",
        "offload_states",
        "reload_states",
    ],
    "changing batch sizes after initialize()": [
        "set_train_batch_size",
        "set_train_micro_batch_size",
    ],
}


def _public(obj: Any) -> list[str]:
    names = getattr(obj, "__all__", None)
    if names is None:
        names = [n for n in vars(obj) if not n.startswith("_")]
    return sorted(n for n in names if not n.startswith("_"))


def engine_members() -> list[str]:
    """The DeepSpeed engine members the engine implements (methods, properties, attributes)."""
    from .engine import ZeroEngine

    internal = {"reporter", "scaler", "strategy", "comm"}
    names = {n for n in dir(ZeroEngine) if not n.startswith("_")} | set(ENGINE_ATTRIBUTES)
    names |= {"_zero3_consolidated_16bit_state_dict"}
    return sorted(names - internal - set(ENGINE_DIFFERENT))


def api_rows() -> list[Row]:
    """DeepSpeed's module-level names and engine members, with their status."""
    rows = []
    for ds_name, module_name in SURFACE_MODULES.items():
        module = importlib.import_module(module_name)
        for name in _public(module):
            value = getattr(module, name)
            if isinstance(value, type(sys)) and ds_name == "deepspeed":
                continue  # submodules have their own rows
            rows.append(Row(f"{ds_name}.{name}", IMPLEMENTED))
    rows += [Row(name, NOT_BUILT, why) for name, why in NOT_BUILT_MODULES.items()]
    for name in engine_members():
        rows.append(Row(f"engine.{name}", IMPLEMENTED, ENGINE_ATTRIBUTES.get(name, "")))
    rows += [Row(f"engine.{name}", "differs", why) for name, why in ENGINE_DIFFERENT.items()]
    for why, names in ENGINE_NOT_BUILT.items():
        rows.append(Row(", ".join(f"engine.{n}" for n in sorted(names)), NOT_BUILT, why))
    return rows


def _table(rows: list[Row], first: str) -> list[str]:
    lines = [f"| {first} | status | why / notes |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r.name}` | {r.status} | {r.why.replace('|', '/')} |")
    return lines


def markdown() -> str:
    """The generated section of docs/engine.md."""
    return "\n".join(
        [
            "### ds_config keys",
            "",
            *_table(config_rows(), "key"),
            "",
            "### DeepSpeed API names",
            "",
            *_table(api_rows(), "name"),
            "",
        ]
    )


BEGIN, END = "<!-- BEGIN keys.py -->", "<!-- END keys.py -->"


def update(path: str) -> None:
    """Rewrite the generated section of a markdown file (between BEGIN and END)."""
    with open(path) as f:
        text = f.read()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{markdown()}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zeroscope.engine.keys", description=__doc__)
    parser.add_argument("--markdown", action="store_true", help="print the docs/engine.md tables")
    parser.add_argument("--update", metavar="FILE.md", help="rewrite FILE.md's generated section")
    args = parser.parse_args(argv)
    if args.update:
        update(args.update)
    elif args.markdown:
        sys.stdout.write(markdown())
    else:
        for row in config_rows():
            print(f"{row.name}\t{row.status}\t{row.why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
