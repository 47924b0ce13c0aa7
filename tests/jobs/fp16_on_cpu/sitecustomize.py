"""Test-only start-up hook: lets DeepSpeed train in fp16 on this CPU, so its real dynamic loss
scaler (overflow, skipped steps, scale changes) can be exercised without a GPU.

DeepSpeed's CPU accelerator refuses fp16 unless oneDNN reports native fp16 support (AVX512-FP16
/ AMX), which this machine lacks; torch itself computes fp16 on any CPU. The attach tests put
this folder on ``PYTHONPATH`` for the runs with and without zeroscope alike (zeroscope's own
bootstrap chains to it, which the tests thereby check too). Nothing else is changed.
"""

from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

CPU_Accelerator.is_fp16_supported = lambda self: True  # type: ignore[method-assign]
