"""Attach overhead: an unmodified DDP, FSDP2 or DeepSpeed job with the attach on vs off, 2 gloo
ranks.

The same measurement as bench/agent_overhead.py, for jobs zeroscope does not own. One job per
rank, built as the attach finds it in a real run (the attach installed from the first import),
is switched between modes: "on" is everything the bootstrap installs (the class-level
ProcessGroup and Work wrappers, the optimizer and ``Tensor.backward`` hooks, the engine's
wrapped methods and reader with memory counted on its schedule, torch's Flight Recorder read by
the sender thread, one StepReport per step published to a real collector, the sampler thread);
"off" has every patch removed. One job for every mode: two model instances differ by several
percent on an idle machine (allocation order, memory placement), which an "on" instance built
apart from the "off" ones would read as a cost or a saving of the attach.

Blocks of steps run in rounds ordered on, off, off-again, off-again, off, on (ABCCBA): drift
that is linear over a round cancels in both pairs. The figures are medians over rounds of the
rounds' CPU-time ratios: on/off, and off-again/off (the A/A control, this machine's noise floor,
taken the same way). Each on/off median has a bootstrap interval over rounds, and the goal is
judged by bench/goal.py: PASS only when the whole interval is at or below 1.01 and the A/A is
within 2% of 1, FAIL when the whole interval is above 1.01, UNREADABLE otherwise (this machine
has no hardware counters to count instructions instead: ``perf stat -e instructions`` says "not
supported").

Process CPU (the goal) is the whole rank process's, every thread, with the agent's own threads
(its sender/sampler, ZeroMQ's I/O and reaper: per-thread CPU clocks, bench/thread_cpu.py)
charged to "on": they wake on their own timers, often in an "off" block, and a job without
zeroscope runs none of them. So the "off" blocks lose their agent-thread CPU, and the "on"
blocks keep theirs plus what the "off" blocks next to them spent beyond the "off-again" ones
(the work "on" steps left for the sender, over the timer-paced rate both "off" modes pay).
Every "on" block also ends by draining what its steps handed over, on the training thread and
in the process clock (the Flight Recorder read made due), so no report of an "on" step is left
for the sender to finish in an "off" block; a block of 12 steps makes that read about as often
as DDP's own. The job's figure for a round sums both ranks. Beside it, the training thread's
own CPU clock (what can slow the job's steps), read before the drain. The activation count's
time floor (agent/cadence.py) runs on "on" time only, as in a run with the attach always on.

- ``--engine ddp``: DDP (1 MB buckets) over an MLP of ``--layers`` x ``--width``; its group
  watched in torch's Flight Recorder, which the agent's sender thread reads (DDP's reducer runs
  as it is). The recorder itself is process-wide (set before the groups exist), so every mode
  records into it: its per-collective cost is not in the ratio, its reads are.
- ``--engine fsdp2``: the same MLP under ``fully_shard`` per linear layer and at the root
  (an all-gather per layer in forward and backward, a reduce-scatter per layer).
- ``--engine deepspeed``: a ZeRO-3 engine (every parameter sharded, none persistent, so each
  step issues a gather per layer in forward and backward and a reduce-scatter per bucket): the
  many-collective case.
- ``--amp``: the loop under fp16 CPU autocast with a ``torch.amp.GradScaler`` (the attach's
  scaler wrappers on: the loss read before scaling, the scale copied for the sender thread at
  ``step()`` and ``update()``).
- ``--compile``: the model under ``torch.compile`` (``aot_eager``), compiled in both modes
  during the warm-up (a frame compiled while measuring is reported): the attach runs nothing
  inside the compiled region; its forward wrapper, saved-tensor hooks and backward hook sit
  outside it.

``--interleave`` (the form the goal is read in since 2026-12-02): blocks of one step, ABCCBA
per six steps, as bench/agent_overhead.py does. On this 2-vCPU VM one step's CPU time varies
from ~12 to ~26 ms for the same matmuls even alone (other guests on the host), and drifts over
seconds: blocks of 12 steps left each round's ratio 10-20% off, and 10-16 rounds gave 90%
intervals 5-12% wide; one-step blocks put the modes of a round within ~0.2 s, and 400 rounds
(~2 min for DDP) give intervals ~1.5% wide with an A/A within 0.5%. No barrier and no drain
per block (each would add a collective or a recorder read per step); each block's own
agent-thread CPU is taken out of its process CPU, and the agent's threads' CPU over the whole
loop, plus the training thread's one drain at its end, is charged to the "on" steps alone (the
"off" steps' timer-paced heartbeats included: an upper bound, ~0.1-0.2%). Toggling every
other step costs nothing measurable: "on" steps right after a toggle and those after another
"on" step read the same.

To split a cost: ``--without PART ...`` leaves parts of the attach out of "on" (agent/attach/
install.py), ``--gc`` times Python's garbage collector per block.

Usage: ``python bench/attach_overhead.py [--engine ddp|fsdp2|deepspeed] [--amp] [--compile]
[--interleave --rounds 400 | --rounds 10 --steps 12] [--without PART ...] [--gc] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.attach_figures import describe, job, per_round, row

PARTS = (
    "collectives",
    "loop",
    "scaler",
    "clip",
    "ddp",
    "fsdp2",
    "fsdp1",
    "mesh",
    "pipeline",
    "compiled",
    "spawned",
)
"""``--without`` names: the attach's parts (agent/attach/install.py ``torch_parts``), in order."""


_INSTALLED = [False]
"""Whether the attach is on (``collectives.installed()`` cannot say: ``--without collectives``
leaves that part out, and every "on" block would install the others once more)."""


def _toggle(on: bool, deepspeed: Any, without: tuple[str, ...] = ()) -> None:
    from zeroscope.agent.attach import collectives, deepspeed_engine, install, patches

    now_on = _INSTALLED[0] or collectives.installed()
    _INSTALLED[0] = on
    if on and not now_on:
        if without:  # a cost split: every part but those named
            for name, (part, install_part) in zip(PARTS, install.torch_parts(), strict=True):
                if name not in without:
                    install.guarded(part, install_part)
        else:
            install._torch_ready(None)  # what the bootstrap's post-import hook runs
        if deepspeed is not None:
            deepspeed_engine.install(deepspeed)
    elif not on and now_on:
        patches.restore_all()


def _model(args: Any) -> Any:
    import torch

    torch.manual_seed(0)
    layers: list[Any] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1))


class _GcClock:
    """The training thread's CPU in Python's garbage collector, per block (``--gc``): the
    agent's allocations can make the collector run more often, and a collection's cost grows
    with every object the process holds (a compiled job holds many)."""

    def __init__(self) -> None:
        import gc
        import threading

        self.ns = 0
        self.full = 0
        self._t0 = 0
        self._ident = threading.get_ident
        self._main = threading.get_ident()
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if self._ident() != self._main:
            return
        if phase == "start":
            self._t0 = time.thread_time_ns()
        else:
            self.ns += time.thread_time_ns() - self._t0
            self.full += info.get("generation") == 2


def build_job(args: Any) -> tuple[Callable[[Any, Any], None], Any]:
    """The job (in this rank, its process group made): its step ``train(x, y)``, and the
    ``deepspeed`` module for a DeepSpeed job (whose reader is installed with the attach)."""
    import torch
    import torch.distributed as dist

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

        def train(x: Any, y: Any) -> None:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()

    else:
        dist.init_process_group("gloo")
        model = _model(args)
        if args.engine == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer)
            model = fully_shard(model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
        if args.compile:
            model = torch.compile(model, backend="aot_eager")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        scaler = torch.amp.GradScaler("cpu")

        def train(x: Any, y: Any) -> None:
            if not args.amp:
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                opt.zero_grad()
                return
            with torch.autocast("cpu", dtype=torch.float16):  # fp16, a dynamic loss scale
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()

    return train, deepspeed


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
    without = tuple(args.without)
    if without:  # the job is built as the attach finds it in a real run, less those parts
        if args.compile:
            import torch._dynamo  # its import hook fires now: installed once, not twice

        _toggle(False, None)
        _toggle(True, None, without)
    train, deepspeed = build_job(args)
    x, y = torch.randn(args.batch, args.width), torch.randn(args.batch, 1)
    from bench.thread_cpu import ThreadsCpu, agent_thread_ids
    from zeroscope.agent.attach.flight_recorder import READER as RECORDER
    from zeroscope.agent.attach.session import SESSION

    for _ in range(3):  # warm-up: buckets rebuilt, optimizer state, compiled in both modes
        for on in (True, False):
            _toggle(on, deepspeed, without)
            train(x, y)
    _toggle(False, deepspeed)
    # The activation count's time floor (agent/cadence.py) runs on the time of "on" blocks
    # only: interleaved with two "off" blocks, wall time would count three times as often per
    # "on" step as a run with the attach always on does.
    on_time = [0.0]
    # The same for the memory census's (agent/attach/session.py ``memory_cadence``).
    for cadence in (
        getattr(SESSION.tel, "_cadence", None),
        getattr(SESSION, "memory_cadence", None),
    ):
        if cadence is not None:
            cadence.clock = lambda: on_time[0]
            cadence._last = -float("inf")  # its last count was on the wall clock
    frames = _compiled_frames()
    agent = ThreadsCpu(agent_thread_ids())
    gc_clock = _GcClock() if args.gc else None
    modes = ("on", "off", "off-again")
    keys = ("cpu", "main", "wall", "agent", "gc")
    blocks: dict[str, dict[str, list[float]]] = {k: {m: [] for m in modes} for k in keys}
    step_main: dict[str, list[int]] = {m: [] for m in modes}
    """Each step's training-thread CPU (ns), per mode, in order (the per-step spread)."""
    loop_agent0, loop_dumps0 = agent.ns(), RECORDER.dumps
    recorded = dumps = 0
    for _ in range(args.rounds):
        for mode in ("on", "off", "off-again", "off-again", "off", "on"):  # ABCCBA
            _toggle(mode == "on", deepspeed, without)
            if not args.interleave:
                dist.barrier()
            if mode == "on":
                _skip_off_collectives(RECORDER)
            before, dumped = collectives.LOG.recorded, RECORDER.dumps
            g0 = 0 if gc_clock is None else gc_clock.ns
            t0, c0, m0, a0 = (
                time.perf_counter(),
                time.process_time(),
                time.thread_time(),
                agent.ns(),
            )
            steps = step_main[mode]
            for _ in range(args.steps):
                s0 = time.thread_time_ns()
                train(x, y)
                steps.append(time.thread_time_ns() - s0)
            m1 = time.thread_time()
            if mode == "on" and SESSION.tel is not None and not args.interleave:
                RECORDER.wanted = True  # the recorder read due (else its reports wait for it)
                SESSION.tel.drain()  # what these steps handed over, sent on this block's clock
            figures = (
                time.process_time() - c0,
                m1 - m0,
                time.perf_counter() - t0,
                (agent.ns() - a0) / 1e9,
                0 if gc_clock is None else (gc_clock.ns - g0) / 1e9,
            )
            for key, value in zip(keys, figures, strict=True):
                blocks[key][mode].append(value / args.steps)
            if mode == "on":
                on_time[0] += figures[2]
                recorded += collectives.LOG.recorded - before
                dumps += RECORDER.dumps - dumped
    # --interleave: every thread of the agent, over the whole loop (each block's own share is
    # taken out of its process CPU below), plus the training thread's drain of what is left,
    # is charged to the "on" steps alone: the timer-paced work of the "off" steps included.
    loop_agent = agent.ns() - loop_agent0
    if args.interleave and SESSION.tel is not None:
        t0 = time.thread_time_ns()
        RECORDER.wanted = True
        SESSION.tel.drain()
        loop_agent += time.thread_time_ns() - t0
    if args.interleave:  # the sender reads the recorder whenever it wakes, "off" steps or not
        dumps = RECORDER.dumps - loop_dumps0
    _toggle(False, deepspeed)
    on_steps = 2 * args.rounds * args.steps
    out.put(
        (
            rank,
            {
                "rank": rank,
                **blocks,
                "step_main": step_main,
                "interleave_agent_s": loop_agent / 1e9 if args.interleave else None,
                "collectives_per_step": recorded / on_steps,
                "dumps_per_step": dumps / on_steps,
                "agent_threads": agent.names,
                "frames_compiled_measuring": _compiled_frames() - frames,
                "full_collections": None if gc_clock is None else gc_clock.full,
                "errors": SESSION.errors,
                "steps_reported": SESSION.steps,
            },
        )
    )
    if SESSION.tel is not None:
        SESSION.tel.close()


def _compiled_frames() -> int:
    """Frames Dynamo compiled so far in this process (a recompile while measuring would be a
    cost of switching modes, which no real run pays)."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    return 0 if dynamo is None else int(dynamo.counters["frames"]["total"])


def _skip_off_collectives(reader: Any) -> None:
    """The "off" models' collectives ran on the group the reader watches (DDP's default
    group), which no real job has: the reader starts each "on" block from the group's present
    sequence number, as if those were never issued (else the first "on" step would read them
    as its own backlog, and size the ring's headroom on them)."""
    for name, group in reader.groups.items():
        group.taken = int(reader._objects[name]._get_sequence_number_for_group())
        group.claimed.clear()
    reader._last_marks = {}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import os as _os

    from bench.agent_overhead import spawn_ranks
    from bench.harness import paired_ratio

    if args.interleave:
        args.steps = 1
    load = _os.getloadavg()[0]
    results, received = spawn_ranks(rank_main, args, timeout=3600)
    ranks = []
    for _, r in results:
        cpu, main, wall = (per_round(r, k) for k in ("cpu", "main", "wall"))
        agent, gc = ({m: statistics.median(v) for m, v in r[k].items()} for k in ("agent", "gc"))
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
                "agent_threads_us": {m: v * 1e6 for m, v in agent.items()},
                "gc_us": {m: v * 1e6 for m, v in gc.items()},
                "agent_threads": r["agent_threads"],
                "frames_compiled_measuring": r["frames_compiled_measuring"],
                "full_collections": r["full_collections"],
                "collectives_per_step": r["collectives_per_step"],
                "dumps_per_step": r["dumps_per_step"],
                "errors": r["errors"],
                "steps_reported": r["steps_reported"],
                "step_main": r["step_main"],
                "interleave_agent_s": r["interleave_agent_s"],
                "blocks": {k: r[k] for k in ("cpu", "main", "wall", "agent")},
            }
        )
    return {
        "engine": args.engine,
        "amp": args.amp,
        "compile": args.compile,
        "without": list(args.without),
        "gc": args.gc,
        "rounds": args.rounds,
        "steps": args.steps,
        "load_start": load,
        "load_end": _os.getloadavg()[0],
        "ranks": ranks,
        "cpu": row(job(results, "cpu")),
        "main": row(job(results, "main")),
        "collector": received,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("ddp", "fsdp2", "deepspeed"), default="ddp")
    parser.add_argument("--rounds", type=int, default=10, help="ABCCBA rounds")
    parser.add_argument(
        "--steps",
        type=int,
        default=12,
        help="steps per block (each 'on' block ends with a Flight Recorder read; DDP's own "
        "reads come about every 12 steps, so a block of 12 adds none to what a real run makes)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="blocks of one step (ABCCBA per step: the VM's drift cancels within 6 steps), "
        "no barrier and no drain per block; every agent thread's CPU over the whole loop is "
        "charged to the 'on' steps. Needs hundreds of rounds",
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
    parser.add_argument(
        "--without",
        nargs="*",
        default=[],
        choices=PARTS,
        help="leave these parts of the attach out of the 'on' mode (to split a cost)",
    )
    parser.add_argument(
        "--gc", action="store_true", help="also time Python's garbage collector per block"
    )
    parser.add_argument("--json", default="", help="also write the result (every round) here")
    return parser


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
