"""What the engine does with each top-level ds_config key of DeepSpeed 0.19.8 that is not a
field of :class:`~.config.DeepSpeedConfig` (the fields are implemented).

The rule: a key that only tunes DeepSpeed's own speed, memory or logging is accepted
and reported once as ignored, with the reason; a key that would change the numbers is refused
unless it is switched off. ``tests/test_deepspeed_keys.py`` enumerates the keys DeepSpeed's own
config reader looks up and fails when one is missing here or from the fields; docs/engine.md's
key table is generated from these tables (``python -m zeroscope.engine.keys --markdown``).
"""

from __future__ import annotations

from .config_parse import Ignored, KeyStatus, Refused

_MONITOR = Ignored(
    "DeepSpeed's metric writer; zeroscope records loss, lr, grad norm, loss scale and memory "
    "every step itself"
)


def _removed(what: str) -> Refused:
    """A block DeepSpeed 0.19.8 removed (and refuses with an error); accepted here only when off."""
    return Refused(f"{what} was removed from DeepSpeed 0.19.8, which refuses this key too")


TOP_LEVEL_KEYS: dict[str, KeyStatus] = {
    # DeepSpeed's own logging, monitoring and speed knobs: no effect on the numbers.
    "wall_clock_breakdown": Ignored(
        "DeepSpeed's per-phase timers; zeroscope times forward, backward and optimizer always"
    ),
    "tensorboard": _MONITOR,
    "wandb": _MONITOR,
    "csv_monitor": _MONITOR,
    "comet": _MONITOR,
    "flops_profiler": Ignored(
        "DeepSpeed's FLOPs profiler prints a per-module report at one step; training is unchanged"
    ),
    "comms_logger": Ignored(
        "DeepSpeed's collective log; zeroscope times every collective (bytes, time, busbw) itself"
    ),
    "timers": Ignored("DeepSpeed's throughput timer; zeroscope times every step and phase itself"),
    "memory_breakdown": Ignored(
        "DeepSpeed's memory printouts; zeroscope reports P/G/O/A bytes every step"
    ),
    "dump_state": Ignored("prints DeepSpeed's engine state at start-up"),
    "log_level": Ignored("the level of DeepSpeed's own logger"),
    "autotuning": Ignored(
        "settings of DeepSpeed's autotuner, which runs only under `deepspeed --autotuning`"
    ),
    "disable_python_gc": Ignored("DeepSpeed's garbage-collector tuning (speed)"),
    "disable_allgather": Ignored("read by nothing in DeepSpeed 0.19.8 either"),
    "datastates_ckpt": Ignored(
        "DeepSpeed's asynchronous checkpoint writer (speed); checkpoints are written synchronously"
    ),
    "compile": Ignored(
        "options of DeepSpeed's DeepCompile passes (speed); this engine's compile() is "
        "torch.compile of the module"
    ),
    "use_data_before_expert_parallelism": Ignored(
        "process-group layout for mixture-of-experts expert parallelism, not built here"
    ),
    "vocabulary_size": Ignored("read only by DeepSpeed's data-efficiency library"),
    # Would change the numbers: refused unless off or DeepSpeed's default.
    "prescale_gradients": Refused(
        "divides gradients by N before the reduction instead of after (different 16-bit "
        "rounding); not built",
        (False,),
    ),
    "gradient_predivide_factor": Refused(
        "splits the 1/N gradient averaging around the reduction; not built", (1.0,)
    ),
    "gradient_allreduce_op": Refused("only the mean of the ranks' gradients is built", ("mean",)),
    "communication_data_type": Refused(
        "reduces gradients in another dtype than the training one; not built", (None,)
    ),
    "seq_parallel_communication_data_type": Refused(
        "sequence parallelism is not built", ("fp32", None)
    ),
    "managed_gradient_accumulation": Refused(
        "false makes every step() an accumulation boundary; not built (use "
        "set_gradient_accumulation_boundary)",
        (True,),
    ),
    "torch_autocast": Refused(
        "autocast changes the forward's numerics and is not built; use fp16 or bf16"
    ),
    "hybrid_engine": Refused("DeepSpeed's RLHF hybrid engine is not built"),
    "expert_parallel": Refused("mixture-of-experts expert parallelism is not built"),
    "weight_quantization": Refused("quantized weights change the numbers; not built"),
    "data_efficiency": Refused(
        "curriculum learning and random-LTD change the data each step sees; not built"
    ),
    "nebula": _removed("Nebula checkpointing"),
    "compression_training": _removed("the compression library"),
    "amp": _removed("NVIDIA Apex AMP"),
    "quantize_training": _removed("Mixture-of-Quantization"),
    "sparse_gradients": _removed("sparse embedding-gradient compression"),
    "eigenvalue": _removed("eigenvalue-based MoQ"),
    "sparse_attention": _removed("Sparse Attention"),
    "elasticity": _removed("elastic training"),
    "graph_harvesting": _removed("graph harvesting"),
    "curriculum_learning": _removed("top-level curriculum_learning"),
    "progressive_layer_drop": _removed("progressive layer dropping"),
}
