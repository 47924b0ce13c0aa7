"""The status of DeepSpeed's API names on the engine, as tables that engine/keys.py turns into
docs/engine.md: which DeepSpeed modules the surface serves, what is not built and why, and the
engine members that differ. ``tests/test_deepspeed_keys.py`` checks them against DeepSpeed's
own engine class.
"""

from __future__ import annotations

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
    "deepspeed.pipe": "zeroscope.engine.deepspeed.pipe",
    "deepspeed.runtime.pipe": "zeroscope.engine.deepspeed.runtime.pipe",
    "deepspeed.runtime.pipe.topology": "zeroscope.engine.deepspeed.runtime.pipe.topology",
}
"""DeepSpeed module -> the engine module that serves it (its public names are implemented)."""

NOT_BUILT_MODULES = {
    "deepspeed.pipe.DualPipeVModule": "DualPipeV is a schedule here (pipeline.schedule "
    "'dualpipev') of a PipelineModule",
    "deepspeed.runtime.pipe.topology.PipelineParallelGrid": "built by the PipelineModule "
    "(module.mpu(), over its DeviceMesh), not from a topology by the user",
    "deepspeed.ops (but ops.adam)": "DeepSpeed's fused and CPU kernels (Lion, Adagrad, Lamb, "
    "...); the engine steps Adam(W) only",
    "deepspeed.moe": "mixture-of-experts layers and expert parallelism",
    "deepspeed.inference / init_inference": "DeepSpeed's inference engine",
    "deepspeed.tp_model_init": "DeepSpeed's AutoTP model init (tensor parallelism is the "
    "tensor_parallel block or mpu=)",
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
    "DeepSpeed's DeepCompile passes (engine.compile() itself is torch.compile of the module)": [
        "compile_autosp",
        "compile_autotp",
        "compile_zero_optimization_stage",
        "get_autosp_backend",
        "get_autotp_backend",
        "get_compile_time",
        "get_deepcompile_backend",
        "get_deepspeed_compile_backend",
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
