"""Attach overhead: an unmodified DDP or DeepSpeed job with the attach on vs off, 2 gloo ranks.

The same measurement as bench/agent_overhead.py, for jobs zeroscope does not own: both modes run
in the same processes, interleaved in blocks of steps (on, off, off-again, ...); the figure is
the median of per-block CPU-time ratios on/off, beside the off-again/off ratio (the A/A control,
this machine's noise floor). "On" is everything the bootstrap installs in a real run: the
class-level ProcessGroup and Work wrappers, the optimizer and ``Tensor.backward`` hooks, the
engine's wrapped methods and reader (memory counted on its schedule), one StepReport per step
published to a real collector, the sampler thread. "Off" has every patch removed.

- ``--engine ddp``: two identical DDP models; the "on" one was built with the attach installed
  (its group watched in torch's Flight Recorder, which the agent's sender thread reads; DDP's
  reducer runs as it is), the "off" one without. The recorder itself is process-wide (set
  before the groups exist), so both modes record into it: its per-collective cost is not in
  the ratio, its reads are. An MLP of ``--layers`` x ``--width`` with 1 MB buckets.
- ``--engine deepspeed``: one ZeRO-3 engine (every parameter sharded, none persistent, so each
  step issues a gather per layer in forward and backward and a reduce-scatter per bucket),
  toggled between modes: the many-collective case.
- ``--engine ddp --amp``: the DDP loop under fp16 CPU autocast with a ``torch.amp.GradScaler``
  per model (the attach's scaler wrappers on: the loss read before scaling, the scale copied
  for the sender thread at ``step()`` and ``update()``).

- ``--engine ddp --compile``: the same DDP models under ``torch.compile`` (``aot_eager``, each
  compiled during the warm-up): the attach runs nothing inside the compiled region, and its
  forward wrapper, saved-tensor hooks and backward hook sit outside it.

Usage: ``python bench/attach_overhead.py [--engine ddp|deepspeed] [--amp] [--compile]
[--blocks 10] [--steps 2]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _toggle(on: bool, deepspeed: Any) -> None:
    from zeroscope.agent.attach import collectives, deepspeed_engine, install, patches

    if on and not collectives.installed():
        install._torch_ready(None)  # what the bootstrap's post-import hook runs
        if deepspeed is not None:
            deepspeed_engine.install(deepspeed)
    elif not on and collectives.installed():
        patches.restore_all()


def _model(args: Any) -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1))


def rank_main(rank: int, world: int, port: int, address: str, args: Any, out: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        ZEROSCOPE_COLLECTOR=address,
        ZEROSCOPE_JOB_ID="bench-attach",
        DS_ACCELERATOR="cpu",
    )
    from zeroscope.agent.attach import collectives
    from zeroscope.agent.attach import install as attach

    attach.install()  # as the bootstrap does, before torch is imported
    import warnings

    warnings.simplefilter("ignore", FutureWarning)  # DeepSpeed's deprecated c10d names
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    deepspeed = None
    if args.engine == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        model = _model(args)
        config = {
            "train_micro_batch_size_per_gpu": args.batch,
            "zero_optimization": {
                "stage": 3,
                "stage3_param_persistence_threshold": 0,
                "stage3_max_reuse_distance": 0,
                "stage3_max_live_parameters": 0,
                "stage3_prefetch_bucket_size": 0,
            },
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        }
        engine, *_ = deepspeed.initialize(
            model=model, config=config, model_parameters=model.parameters()
        )

        def step_on(x: Any, y: Any) -> None:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()

        step_off = step_hook = step_on
    else:
        dist.init_process_group("gloo")

        def compiled(model: Any) -> Any:
            return torch.compile(model, backend="aot_eager") if args.compile else model

        ddp_on = compiled(torch.nn.parallel.DistributedDataParallel(_model(args), bucket_cap_mb=1))
        opt_on = torch.optim.AdamW(ddp_on.parameters(), lr=1e-4)
        _toggle(False, None)
        ddp_off = compiled(torch.nn.parallel.DistributedDataParallel(_model(args), bucket_cap_mb=1))
        opt_off = torch.optim.AdamW(ddp_off.parameters(), lr=1e-4)
        # What any Python comm hook costs DDP (no attach): the share of "on" that is torch's.
        ddp_hook = torch.nn.parallel.DistributedDataParallel(_model(args), bucket_cap_mb=1)
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        ddp_hook.register_comm_hook(None, allreduce_hook)
        ddp_hook = compiled(ddp_hook)
        opt_hook = torch.optim.AdamW(ddp_hook.parameters(), lr=1e-4)

        scalers = {id(o): torch.amp.GradScaler("cpu") for o in (opt_on, opt_off, opt_hook)}

        def train(ddp: Any, opt: Any, x: Any, y: Any) -> None:
            if not args.amp:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
                opt.zero_grad()
                return
            scaler = scalers[id(opt)]  # fp16 autocast with a dynamic loss scale
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(ddp(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

        def step_on(x: Any, y: Any) -> None:
            train(ddp_on, opt_on, x, y)

        def step_off(x: Any, y: Any) -> None:
            train(ddp_off, opt_off, x, y)

        def step_hook(x: Any, y: Any) -> None:
            train(ddp_hook, opt_hook, x, y)

    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, 1)
    for _ in range(3):  # warm-up: buckets rebuilt, optimizer state created, agent connected
        _toggle(True, deepspeed)
        step_on(x, y)
        _toggle(False, deepspeed)
        step_off(x, y)
    modes = ("on", "off", "off-again") + (("python-hook",) if deepspeed is None else ())
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    recorded = 0
    for block in range(len(modes) * args.blocks):
        mode = modes[block % len(modes)]
        _toggle(mode == "on", deepspeed)
        step = {"on": step_on, "python-hook": step_hook}.get(mode, step_off)
        dist.barrier()
        before = collectives.LOG.recorded
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            step(x, y)
        wall[mode].append((time.perf_counter() - t0) / args.steps)
        cpu[mode].append((time.process_time() - c0) / args.steps)
        if mode == "on":
            recorded += collectives.LOG.recorded - before
    from zeroscope.agent.attach.session import SESSION

    _toggle(False, deepspeed)
    per_step = recorded / (args.blocks * args.steps)
    out.put((rank, cpu, wall, per_step, SESSION.errors, SESSION.steps))
    if SESSION.tel is not None:
        SESSION.tel.close()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.agent_overhead import spawn_ranks
    from bench.harness import paired_ratio

    results, received = spawn_ranks(rank_main, args, timeout=3600)
    ranks = []
    for rank, cpu, wall, per_step, errors, steps in results:
        off = statistics.median(cpu["off"])
        ranks.append(
            {
                "rank": rank,
                "cpu_off_s": off,
                "cpu_on_off": paired_ratio(cpu["on"], cpu["off"]),
                "cpu_aa": paired_ratio(cpu["off-again"], cpu["off"]),
                "wall_on_off": paired_ratio(wall["on"], wall["off"]),
                "wall_aa": paired_ratio(wall["off-again"], wall["off"]),
                "cpu_extra_us": (statistics.median(cpu["on"]) - off) * 1e6,
                "cpu_python_hook_off": paired_ratio(cpu.get("python-hook", []), cpu["off"]),
                "collectives_per_step": per_step,
                "errors": errors,
                "steps_reported": steps,
            }
        )
    return {
        "engine": args.engine,
        "amp": args.amp,
        "compile": args.compile,
        "ranks": ranks,
        "collector": received,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("ddp", "deepspeed"), default="ddp")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--amp", action="store_true", help="ddp: fp16 autocast and torch.amp.GradScaler('cpu')"
    )
    parser.add_argument("--compile", action="store_true", help="ddp: torch.compile each model")
    return parser


def main() -> int:
    result = run(parser().parse_args())
    for r in result["ranks"]:
        print(
            f"{result['engine']} rank {r['rank']}: CPU {r['cpu_off_s'] * 1e3:.2f} ms/step off; "
            f"on/off {r['cpu_on_off']:.4f} (A/A {r['cpu_aa']:.4f}); wall on/off "
            f"{r['wall_on_off']:.4f} (A/A {r['wall_aa']:.4f}); bare Python comm hook/off "
            f"{r['cpu_python_hook_off'] or float('nan'):.4f}; {r['cpu_extra_us']:.0f} us/step "
            f"extra CPU; {r['collectives_per_step']:.0f} collectives/step; "
            f"{r['steps_reported']} steps reported, errors {r['errors']}"
        )
    print(f"collector: {result['collector']['accepted']} messages accepted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
