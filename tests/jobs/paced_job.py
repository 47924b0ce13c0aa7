"""A tiny torch.distributed job for the remote tests: one all-reduce per step, a StepReport per
rank per step straight through the agent's Publisher, until a stop file appears (all ranks agree
on the stop step through an all-reduce, so every rank reports the same steps).

Usage (under torchrun, with ZEROSCOPE_COLLECTOR / ZEROSCOPE_TOKEN / ZEROSCOPE_JOB_ID set):
    paced_job.py STOP_FILE [STEP_SECONDS]
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from zeroscope.agent.publish import Publisher
from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Bye,
    Collective,
    ConfigSummary,
    Hello,
    MemoryBytes,
    ParamCounts,
    StepReport,
)


def main() -> None:
    stop_file, pace = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pub = Publisher(
        os.environ["ZEROSCOPE_COLLECTOR"], os.environ.get("ZEROSCOPE_TOKEN", "").encode()
    )
    pub.set_sticky(
        Hello(
            schema_version=SCHEMA_VERSION,
            job_id=os.environ.get("ZEROSCOPE_JOB_ID", ""),
            rank=rank,
            world_size=world,
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            node_rank=int(os.environ.get("GROUP_RANK", "0")),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started_ns=time.time_ns(),
            config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
            params=ParamCounts(total=4, trainable=4),
        )
    )
    deadline = time.monotonic() + 30
    while pub.hello_pending and time.monotonic() < deadline:
        time.sleep(0.02)
        pub.poll_connection()
    grad = torch.ones(4)
    step = 0
    while True:
        t0 = time.perf_counter()
        work = dist.all_reduce(grad, async_op=True)
        work.wait()
        grad.fill_(1.0)
        dt = time.perf_counter() - t0
        pub.send(
            StepReport(
                rank=rank,
                step=step,
                wall_ns=time.time_ns(),
                duration_s=dt,
                memory=MemoryBytes(params=16, grads=16, optim=32),
                collectives=[Collective("all_reduce", 16, world, 0.0, dt, dt)],
                loss=1.0 / (step + 1),
                samples=1,
            )
        )
        flag = torch.tensor([1.0 if os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        if flag.item() > 0:
            break
        step += 1
        time.sleep(pace)
    pub.send(Bye(rank=rank, step=step, wall_ns=time.time_ns(), exit_code=0))
    pub.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
