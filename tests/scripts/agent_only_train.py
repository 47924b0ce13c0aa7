"""A training loop that reports through the public agent API without the bundled engine: the
end-to-end tests of ``zeroscope run`` / ``replay`` use it so they prove the launcher, collector,
trace and views on their own (the demo, on the real engine, is tested beside it).

Each rank trains a tiny linear model with plain DDP-style gradient all-reduce and reports the
exact bytes it holds (P/G/O as fp32 Adam: 4 + 4 + 8 bytes per parameter).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

from zeroscope.agent.api import telemetry
from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts

_HELD: list[object] = []


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--fail-at", type=int, default=-1, help="exit 3 at this step")
    parser.add_argument("--kill-at", type=int, default=-1, help="SIGKILL --kill-rank here")
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument(
        "--step-s", type=float, default=0.0, help="compute time per step of --kill-rank"
    )
    parser.add_argument(
        "--chatter",
        type=float,
        default=0.0,
        help="rank 0 prints after each step, pausing this long: an unfinished 'LOSS' line "
        "(odd steps) or a progress bar ending in '\\r' (even steps)",
    )
    parser.add_argument(
        "--ignore-sigint", action="store_true", help="go on training through SIGINT"
    )
    args = parser.parse_args()
    if args.ignore_sigint:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    psi = sum(p.numel() for p in model.parameters())
    tel = telemetry()
    tel.hello(
        config=ConfigSummary(stage=0, precision="fp32", dp_world_size=world),
        params=ParamCounts(total=psi, trainable=psi),
    )
    data = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        if step == args.fail_at:  # every rank: a job failing as one, its group ended first
            _end_process_group()
            sys.exit(3)
        if step == args.kill_at and rank == args.kill_rank:  # a crash no handler sees
            os.kill(os.getpid(), signal.SIGKILL)
        with tel.phase("forward"):
            if rank == args.kill_rank:  # the others wait for it in the all-reduce
                time.sleep(args.step_s)
            x = torch.randn(16, 64, generator=data)
            loss = (model(x) - x).pow(2).mean()
        with tel.phase("backward"):
            loss.backward()
            for p in model.parameters():
                assert p.grad is not None
                work = dist.all_reduce(p.grad, async_op=True)
                tel.collective(
                    work, op="all_reduce", nbytes=p.grad.numel() * 4, group_size=world
                ).wait()
                p.grad /= world
        with tel.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        tel.step_end(
            memory=MemoryBytes(params=4 * psi, grads=4 * psi, optim=8 * psi),
            loss=loss.detach(),
            lr=1e-2,
            samples=16,
        )
        if args.chatter and rank == 0:
            _chatter(step + 1, args.steps, float(loss), args.chatter)
    _end_process_group()


def _end_process_group() -> None:
    """The end of tests/jobs/teardown.py (this script runs without the repository on its path):
    a barrier whose Work is kept, past torch's gloo teardown abort (docs/testing.md). A rank
    leaving with its group up aborted there (exit 134 for the 3 the test expects) once in a
    full suite's run on Python 3.12."""
    work = dist.barrier(async_op=True)
    work.wait()
    _HELD.append(work)
    dist.destroy_process_group()


def _chatter(step: int, steps: int, loss: float, pause_s: float) -> None:
    """What training scripts print while their step's report is on its way: a line written in
    two parts with a pause between (a prompt, ``print()`` on an unbuffered stdout), or a
    progress bar redrawn with ``\r`` (tqdm's way)."""
    if step % 2:
        os.write(1, f"LOSS {loss:.4f}".encode())
        time.sleep(pause_s)
        os.write(1, b"\n")
    else:
        os.write(1, f"progress {step}/{steps}\r".encode())
        time.sleep(pause_s)


if __name__ == "__main__":
    main()
