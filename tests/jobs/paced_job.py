"""A tiny torch.distributed job for the remote tests, reporting through the public agent API
(``zeroscope.agent.api.telemetry``, the engine's seam): one tracked all-reduce and one
StepReport per rank per step, until a stop file appears (the ranks agree on the last step
through an all-reduce, so every rank reports the same steps).

Usage (under torchrun, with ZEROSCOPE_COLLECTOR / ZEROSCOPE_TOKEN / ZEROSCOPE_JOB_ID set):
    paced_job.py STOP_FILE [STEP_SECONDS]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

# Run without the repository on sys.path (as a user's script is): the teardown helper by path.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from teardown import end_process_group

from zeroscope.agent.api import telemetry
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts


def main() -> None:
    stop_file, pace = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    tel = telemetry()
    assert tel.enabled, "ZEROSCOPE_COLLECTOR is not set"
    tel.hello(
        config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
        params=ParamCounts(total=4, trainable=4),
    )
    grad = torch.ones(4)
    step = 0
    while True:
        with tel.phase("forward"):
            grad.fill_(1.0)
        with tel.phase("backward"):
            work = dist.all_reduce(grad, async_op=True)
            tel.collective(work, op="all_reduce", nbytes=16, group_size=world).wait()
        tel.step_end(
            memory=MemoryBytes(params=16, grads=16, optim=32), loss=1.0 / (step + 1), samples=1
        )
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        step += 1
        time.sleep(pace)
    tel.close(0)
    end_process_group()


if __name__ == "__main__":
    main()
