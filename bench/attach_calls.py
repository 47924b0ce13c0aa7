"""Where the attach's time on the training thread goes: each call's CPU in a real run, and what
running cold costs.

    python bench/attach_calls.py [--steps 400] [--layers 8] [--width 512]

bench/attach_overhead.py says how much the attach costs a job; this says where, in a run shaped
as a user's (the attach installed before torch is imported, on for every step, reporting to a
real collector in another process): one gloo rank, DDP over an MLP of ``--layers`` x
``--width`` (1 MB buckets, AdamW, batch 32). Each of the attach's calls on the training thread
is timed by its own thread CPU clock (``time.thread_time_ns``, ~0.2 us a read: nested calls
include their callees and the timers inside them); the job's phases are timed from outside.

Beside them, a control: a fixed ~20-line Python function (the shape of the Flight Recorder
reader's urgency check: a few dict reads, a sort of eight ints) timed right after a step of
the job ("cold": the job's kernels have just been through the caches) and again at once
("warm"). The ratio is what each line of Python the attach runs between the job's kernels
costs over the same line in a loop; on this project's 2-core VM it is ~7x (~17 against ~2.3
us), which is why the attach's share of a step follows the number of calls and lines it runs
there far more than their instruction count (docs/bench.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_COLLECTOR = (
    "import sys, time\n"
    "from zeroscope.collector.server import Collector\n"
    "c = Collector(); c.__enter__(); print(c.ingest_address, flush=True)\n"
    "while True: time.sleep(1)\n"
)

TIMED: dict[str, list[int]] = {}
"""Each timed call's thread CPU per call [ns], by name."""


def _timed(owner: Any, name: str, label: str) -> None:
    """Replace ``owner.name`` by a wrapper that adds each call's thread CPU to ``TIMED``."""
    inner = getattr(owner, name)
    clock = time.thread_time_ns
    spent = TIMED.setdefault(label, [])

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            spent.append(clock() - t0)

    setattr(owner, name, timed)


def _time_attach_calls() -> None:
    """The attach's calls on the training thread (those reached through a module or class
    attribute at call time; the optimizer hooks are registered as functions, so they are
    timed from outside as the step's pre-hook and post-hook spans)."""
    from zeroscope.agent import live, outbox, work
    from zeroscope.agent.attach import collectives, flight_recorder, losses, session, torch_loop

    for owner, names, prefix in (
        (session.AttachSession, ("end_step", "enter", "exit", "before_step", "add_loss"), ""),
        (session.AttachSession, ("_send", "_memory_due"), ""),
        (live.LiveTelemetry, ("step_end",), "telemetry."),
        (collectives.CollectiveLog, ("take_all",), "collectives."),
        (type(flight_recorder.READER), ("mark", "_urgent"), "recorder."),
        (outbox.Outbox, ("put",), "outbox."),
        (work.WorkMeter, ("take",), "work."),
        (torch_loop, ("first_tensor",), ""),
        (losses, ("mean_loss",), ""),
    ):
        for name in names:
            _timed(owner, name, prefix + name)


def _control(recent: list[int], last: dict[str, int], taken: dict[str, int]) -> bool:
    """The fixed function of the cold/warm control (the recorder's urgency check's shape)."""
    marks = {"0": taken["0"] + 64}
    backlog = step = 0
    for name, top in marks.items():
        seen = taken.get(name)
        if seen is not None:
            backlog += max(0, top - seen)
            step += max(0, top - last.get(name, seen))
    recent.append(int(step + 0.5))
    del recent[0]
    typical = sorted(recent)[-2]
    headroom = max(128 // 4, 2 * typical)
    return backlog >= 128 - headroom


def run(args: argparse.Namespace) -> dict[str, Any]:
    collector = subprocess.Popen(
        [sys.executable, "-c", _COLLECTOR],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(args.port),
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            ZEROSCOPE_JOB_ID="bench-attach-calls",
            ZEROSCOPE_COLLECTOR=(collector.stdout.readline() if collector.stdout else "").strip(),
        )
        from zeroscope.agent.attach import install as attach

        attach.install()  # as the bootstrap does, before torch is imported
        return _measure(args)
    finally:
        collector.kill()
        collector.wait()


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from bench.attach_overhead import _model

    torch.set_num_threads(1)
    _time_attach_calls()
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(_model(args), bucket_cap_mb=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, 1)
    clock = time.thread_time_ns
    marks = [0, 0]
    opt.register_step_pre_hook(lambda *a: marks.__setitem__(0, clock()))  # after the attach's
    opt._optimizer_step_code = lambda: marks.__setitem__(1, clock())  # type: ignore[method-assign]
    spans: dict[str, list[int]] = {
        k: [] for k in ("forward", "backward", "pre-hooks", "optimizer", "post-hooks")
    }
    cold: list[int] = []
    warm: list[int] = []
    state = ([8] * 8, {"0": 100}, {"0": 50})
    for i in range(args.warmup + args.steps):
        t0 = clock()
        loss = torch.nn.functional.mse_loss(model(x), y)
        t1 = clock()
        loss.backward()
        t2 = clock()
        opt.step()
        t3 = clock()
        opt.zero_grad()
        c0 = clock()
        _control(*state)
        c1 = clock()
        _control(*state)
        c2 = clock()
        if i == args.warmup - 1:
            for spent in TIMED.values():
                spent.clear()
        if i >= args.warmup:
            for key, ns in zip(
                spans,
                (t1 - t0, t2 - t1, marks[0] - t2, marks[1] - marks[0], t3 - marks[1]),
                strict=True,
            ):
                spans[key].append(ns)
            cold.append(c1 - c0)
            warm.append(c2 - c1)
    dist.destroy_process_group()
    return {"spans": spans, "calls": dict(TIMED), "cold": cold, "warm": warm, "steps": args.steps}


def _us(values: list[int]) -> float:
    return statistics.median(values) / 1e3 if values else float("nan")


def report(result: dict[str, Any]) -> None:
    steps = result["steps"]
    print(f"DDP, one gloo rank, the attach on throughout; {steps} steps; us of thread CPU")
    print("| job's span | median |")
    print("|---|---|")
    for name, values in result["spans"].items():
        print(f"| {name} | {_us(values):.1f} |")
    print()
    print("| attach call | calls a step | median a call | per step (mean) |")
    print("|---|---|---|---|")
    for name, values in sorted(result["calls"].items(), key=lambda kv: -sum(kv[1])):
        if values:
            print(
                f"| {name} | {len(values) / steps:.2f} | {_us(values):.1f} | {sum(values) / steps / 1e3:.1f} |"
            )
    cold, warm = _us(result["cold"]), _us(result["warm"])
    print()
    print(f"control function: cold {cold:.1f} us, warm {warm:.1f} us, cold/warm {cold / warm:.1f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--port", type=int, default=29_731)
    args = parser.parse_args(argv)
    report(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
