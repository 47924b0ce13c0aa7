"""``deepspeed.ops``: only ``ops.adam`` (the Adam classes accelerate and scripts construct); the
engine runs Adam itself, so DeepSpeed's fused and CPU kernels are not needed."""
