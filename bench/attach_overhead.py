"""Attach overhead: an unmodified DDP, FSDP2 or DeepSpeed job with the attach on vs off, 2 gloo
ranks.

The same measurement as bench/agent_overhead.py, for jobs zeroscope does not own. Both modes run
in the same processes, in blocks of steps, each round in the order on, off, off-again,
off-again, off, on (ABCCBA): drift that is linear over a round cancels in both pairs. The
figures are medians over rounds of the round's CPU-time ratios: on/off, and off-again/off (the
A/A control, this machine's noise floor, taken the same way). CPU time is the whole rank
process's (every thread: the agent's sender and ZeroMQ's, gloo's); the job's figure for a
round sums both ranks. Beside it, the same for the training thread's own CPU clock (what can
slow the job's steps). Each on/off median has a bootstrap interval over rounds, and the goal
is judged by bench/goal.py: PASS only when the whole interval is at or below 1.01 and the A/A
is within 2% of 1, FAIL when the whole interval is above 1.01, UNREADABLE otherwise (this
machine has no hardware counters to count instructions instead: ``perf stat -e instructions``
says "not supported"). The agent's sender thread
works when it wakes, not when a step runs: every "on" block ends by draining what its steps
handed over on the training thread (``tel.drain()``, inside the block's clock), so the work an
"on" block caused is charged to it, never to the "off" block after it (blocks of 6 steps: the
drain adds about one Flight Recorder read per block to DDP's own, about one per 6 steps here). "On" is everything the
bootstrap installs in a real run: the class-level ProcessGroup and Work wrappers, the optimizer
and ``Tensor.backward`` hooks, the engine's wrapped methods and reader (memory counted on its
schedule), torch's Flight Recorder read by the sender, one StepReport per step published to a
real collector, the sampler thread. "Off" has every patch removed.

- ``--engine ddp``: DDP models built alike: the "on" one with the attach installed (its group
  watched in torch's Flight Recorder, which the agent's sender thread reads; DDP's reducer runs
  as it is), the "off" and "off-again" ones without. The recorder itself is process-wide (set
  before the groups exist), so every mode records into it: its per-collective cost is not in
  the ratio, its reads are. An MLP of ``--layers`` x ``--width`` with 1 MB buckets.
- ``--engine fsdp2``: the same MLP under ``fully_shard`` per linear layer and at the root
  (an all-gather per layer in forward and backward, a reduce-scatter per layer), built alike.
- ``--engine deepspeed``: one ZeRO-3 engine (every parameter sharded, none persistent, so each
  step issues a gather per layer in forward and backward and a reduce-scatter per bucket),
  toggled between modes: the many-collective case. Its A/A runs the same engine off twice.
- ``--engine ddp --amp``: the DDP loop under fp16 CPU autocast with a ``torch.amp.GradScaler``
  per model (the attach's scaler wrappers on: the loss read before scaling, the scale copied
  for the sender thread at ``step()`` and ``update()``).
- ``--engine ddp --compile``: the same DDP models under ``torch.compile`` (``aot_eager``, each
  compiled during the warm-up): the attach runs nothing inside the compiled region, and its
  forward wrapper, saved-tensor hooks and backward hook sit outside it.

Usage: ``python bench/attach_overhead.py [--engine ddp|fsdp2|deepspeed] [--amp] [--compile]
[--rounds 10] [--steps 6] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import goal


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
    # DeepSpeed JIT-builds its CPU ops on first use, for minutes: the venv's build, as the
    # tests use (tests/conftest.py), rather than one per user cache.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
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

        def train(mode: str, x: Any, y: Any) -> None:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()

    else:
        dist.init_process_group("gloo")

        def wrapped(model: Any) -> Any:
            if args.engine == "fsdp2":
                from torch.distributed.fsdp import fully_shard

                for layer in model:
                    if isinstance(layer, torch.nn.Linear):
                        fully_shard(layer)
                model = fully_shard(model)
            else:
                model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
            return torch.compile(model, backend="aot_eager") if args.compile else model

        pairs = {}
        for mode in ("on", "off", "off-again"):
            _toggle(mode == "on", None)  # the "on" model is built as the attach finds it
            model = wrapped(_model(args))
            pairs[mode] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4))
        scalers = {mode: torch.amp.GradScaler("cpu") for mode in pairs}

        def train(mode: str, x: Any, y: Any) -> None:
            model, opt = pairs[mode]
            if not args.amp:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                return
            scaler = scalers[mode]  # fp16 autocast with a dynamic loss scale
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, 1)
    from bench.thread_cpu import thread_ids
    from zeroscope.agent.attach.flight_recorder import READER as RECORDER
    from zeroscope.agent.attach.session import SESSION

    for _ in range(3):  # warm-up: buckets rebuilt, optimizer state created, agent connected
        for mode in ("on", "off", "off-again"):
            _toggle(mode == "on", deepspeed)
            train(mode, x, y)
    _toggle(False, deepspeed)
    modes = ("on", "off", "off-again")
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    main: dict[str, list[float]] = {m: [] for m in modes}
    wall: dict[str, list[float]] = {m: [] for m in modes}
    recorded = dumps = 0
    tids = len(thread_ids())
    for _ in range(args.rounds):
        for mode in ("on", "off", "off-again", "off-again", "off", "on"):  # ABCCBA
            _toggle(mode == "on", deepspeed)
            dist.barrier()
            if mode == "on":
                _skip_off_collectives(RECORDER)
            before, dumped = collectives.LOG.recorded, RECORDER.dumps
            t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
            for _ in range(args.steps):
                train(mode, x, y)
            if mode == "on" and SESSION.tel is not None:
                RECORDER.wanted = True  # the recorder read due (else its reports wait for it)
                SESSION.tel.drain()  # what these steps handed over, sent on this block's clock
            wall[mode].append((time.perf_counter() - t0) / args.steps)
            cpu[mode].append((time.process_time() - c0) / args.steps)
            main[mode].append((time.thread_time() - m0) / args.steps)
            if mode == "on":
                recorded += collectives.LOG.recorded - before
                dumps += RECORDER.dumps - dumped
    _toggle(False, deepspeed)
    on_steps = 2 * args.rounds * args.steps
    out.put(
        (
            rank,
            {
                "rank": rank,
                "cpu": cpu,
                "main": main,
                "wall": wall,
                "collectives_per_step": recorded / on_steps,
                "dumps_per_step": dumps / on_steps,
                "threads": tids,
                "errors": SESSION.errors,
                "steps_reported": SESSION.steps,
            },
        )
    )
    if SESSION.tel is not None:
        SESSION.tel.close()


def _skip_off_collectives(reader: Any) -> None:
    """The "off" models' collectives ran on the group the reader watches (DDP's default
    group), which no real job has: the reader starts each "on" block from the group's present
    sequence number, as if those were never issued (else the first "on" step would read them
    as its own backlog, and size the ring's headroom on them)."""
    for name, group in reader.groups.items():
        group.taken = int(reader._objects[name]._get_sequence_number_for_group())
        group.claimed.clear()
    reader._last_marks = {}


def _rounds(values: list[float]) -> list[float]:
    """Per-round sums of a mode's two blocks (ABCCBA: each mode runs twice per round)."""
    return [values[i] + values[i + 1] for i in range(0, len(values) - 1, 2)]


def _job(results: list[Any], key: str) -> dict[str, list[float]]:
    """Per mode, each round's figure summed over the ranks: the job's CPU, as one ratio."""
    per_rank = [{m: _rounds(v) for m, v in r[key].items()} for _, r in results]
    return {
        m: [sum(vals) for vals in zip(*(r[m] for r in per_rank), strict=True)] for m in per_rank[0]
    }


def _row(figures: dict[str, list[float]]) -> dict[str, Any]:
    """on/off and A/A for one clock: medians over rounds, the on/off interval, the verdict."""
    on_off = goal.ratios(figures["on"], figures["off"])
    aa = goal.ratios(figures["off-again"], figures["off"])
    interval = goal.median_interval(on_off)
    aa_median = statistics.median(aa) if aa else None
    return {
        "on_off": statistics.median(on_off) if on_off else None,
        "interval": interval,
        "aa": aa_median,
        "aa_interval": goal.median_interval(aa),
        "verdict": goal.verdict(interval, aa_median),
        "per_round": on_off,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os as _os

    from bench.agent_overhead import spawn_ranks
    from bench.harness import paired_ratio

    load = _os.getloadavg()[0]
    results, received = spawn_ranks(rank_main, args, timeout=3600)
    ranks = []
    for _, r in results:
        cpu, main, wall = (
            {m: _rounds(v) for m, v in r[k].items()} for k in ("cpu", "main", "wall")
        )
        off = statistics.median(cpu["off"]) / 2
        ranks.append(
            {
                "rank": r["rank"],
                "cpu_off_s": off,
                "cpu_on_off": paired_ratio(cpu["on"], cpu["off"]),
                "cpu_aa": paired_ratio(cpu["off-again"], cpu["off"]),
                "main_on_off": paired_ratio(main["on"], main["off"]),
                "main_aa": paired_ratio(main["off-again"], main["off"]),
                "wall_on_off": paired_ratio(wall["on"], wall["off"]),
                "wall_aa": paired_ratio(wall["off-again"], wall["off"]),
                "cpu_extra_us": (statistics.median(cpu["on"]) / 2 - off) * 1e6,
                "collectives_per_step": r["collectives_per_step"],
                "dumps_per_step": r["dumps_per_step"],
                "errors": r["errors"],
                "steps_reported": r["steps_reported"],
            }
        )
    return {
        "engine": args.engine,
        "amp": args.amp,
        "compile": args.compile,
        "rounds": args.rounds,
        "steps": args.steps,
        "load_start": load,
        "load_end": _os.getloadavg()[0],
        "ranks": ranks,
        "cpu": _row(_job(results, "cpu")),
        "main": _row(_job(results, "main")),
        "collector": received,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("ddp", "fsdp2", "deepspeed"), default="ddp")
    parser.add_argument("--rounds", type=int, default=10, help="ABCCBA rounds")
    parser.add_argument(
        "--steps",
        type=int,
        default=6,
        help="steps per block (DDP's recorder is read about every 6 steps: a block's closing "
        "drain then adds about one read to what a real run makes)",
    )
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--amp",
        action="store_true",
        help="ddp/fsdp2: fp16 autocast and torch.amp.GradScaler('cpu')",
    )
    parser.add_argument(
        "--compile", action="store_true", help="ddp/fsdp2: torch.compile each model"
    )
    parser.add_argument("--json", default="", help="also write the result (every round) here")
    return parser


def describe(result: dict[str, Any]) -> list[str]:
    """One line per rank: the ratios with their A/A control."""
    job = (
        result["engine"]
        + ("+amp" if result["amp"] else "")
        + ("+compile" if result["compile"] else "")
    )
    lines = []
    for r in result["ranks"]:
        lines.append(
            f"{job} rank {r['rank']}: CPU {r['cpu_off_s'] * 1e3:.2f} ms/step off; on/off "
            f"{r['cpu_on_off']:.4f} (A/A {r['cpu_aa']:.4f}); training thread on/off "
            f"{r['main_on_off']:.4f} (A/A {r['main_aa']:.4f}); wall on/off "
            f"{r['wall_on_off']:.4f} (A/A {r['wall_aa']:.4f}); {r['cpu_extra_us']:.0f} us/step "
            f"extra CPU; {r['collectives_per_step']:.1f} wrapped collectives/step; "
            f"{r['dumps_per_step']:.2f} recorder dumps/step; {r['steps_reported']} steps "
            f"reported, errors {r['errors']}"
        )
    for clock, name in (("cpu", "process CPU (the goal)"), ("main", "training thread CPU")):
        row = result[clock]
        interval = row["interval"]
        span = "NA" if interval is None else f"{interval[0]:.4f}-{interval[1]:.4f}"
        lines.append(
            f"{job} both ranks, {name}: on/off {row['on_off']:.4f} (90% interval {span}), "
            f"A/A {row['aa']:.4f}: {row['verdict']}"
        )
    lines.append(
        f"{result['rounds']} rounds x 6 blocks x {result['steps']} steps; load average "
        f"{result['load_start']:.1f} -> {result['load_end']:.1f}; collector: "
        f"{result['collector']['accepted']} messages accepted"
    )
    return lines


def main() -> int:
    args = parser().parse_args()
    result = run(args)
    for line in describe(result):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
