"""Engine side by side: zeroscope's stages 0-3 and offload beside torch DDP,
ZeroRedundancyOptimizer, FSDP2 and DeepSpeed, 2 gloo ranks on CPU, one model, one run.

Every contender lives in the same two rank processes for the whole run; each round runs every
contender for ``steps`` steps, the order rotating round by round (harness.rotated); round 0 is
warm-up and dropped. Step time is taken between two barriers (the slower rank's). Figures:

- step time: median over rounds; "zeroscope / this" = median of per-round ratios of the
  zeroscope contender of the same stage to this one (> 1: zeroscope is slower).
- held MiB: growth of the rank's resident set from before building the contender to after its
  warm-up round (model, optimizer state, buffers it keeps), comparable across frameworks.
- step peak MiB: growth of the peak RSS over a measured step above the RSS before it (VmHWM
  after, /proc/self/clear_refs resetting the peak); glibc mmaps allocations over 64 KiB
  (MALLOC_MMAP_THRESHOLD_) so freed tensors leave the resident set at once.
- zeroscope rows: model state P+G+O as the engine reports it beside zeroscope.state.formulas.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from bench.contenders import Spec, build, specs
from bench.harness import Table, cell, median, paired_ratio, rotated, verdict

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _rss(what: str) -> int:
    """Resident-set bytes now, or the peak since the last reset; "reset" resets the peak."""
    if what == "reset":
        _reset_peak()
        return 0
    return _kib("VmHWM" if what == "peak" else "VmRSS") * 1024


def _cuda_mem(what: str) -> int:
    import torch

    if what == "reset":
        torch.cuda.synchronize()  # the bench, not the profiler: it may synchronize
        torch.cuda.reset_peak_memory_stats()
        return 0
    if what == "peak":
        return int(torch.cuda.max_memory_allocated())
    return int(torch.cuda.memory_allocated())


def _rank(rank: int, world: int, port: int, job: dict[str, Any], out: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        DS_ACCELERATOR="cpu",
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    shape, steps, rounds = job["shape"], job["steps"], job["rounds"]
    cuda = shape.get("device") == "cuda"
    if cuda:  # bench/gpu_check.py: NCCL rows; memory is the allocator's, not the RSS
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo")
    mem = _cuda_mem if cuda else _rss
    g = torch.Generator().manual_seed(1 + rank)
    tokens = torch.randint(
        0, shape["vocab"], (steps, shape["batch"], shape["block"] + 1), generator=g
    )
    dev = "cuda" if cuda else "cpu"
    data = [(t[:, :-1].contiguous().to(dev), t[:, 1:].contiguous().to(dev)) for t in tokens]
    # Import every framework before measuring, so a library's one-time state (imported modules,
    # DeepSpeed's op loading) is not charged to whichever contender happens to be built first.
    import torch.distributed.fsdp
    import torch.distributed.optim

    import zeroscope.engine.api  # noqa: F401

    if any(s.family == "deepspeed" for s in job["specs"]):
        import deepspeed  # noqa: F401
    from bench.contenders import build_model

    # The process's first training step allocates for good (autograd engine, thread pools,
    # allocator arenas): pay that on a throwaway model, not on the first contender.
    spare = build_model(shape, "cuda" if cuda else "cpu")
    spare(*data[0]).backward()
    del spare
    live: dict[str, Any] = {}
    held: dict[str, int] = {}
    errors: dict[str, str] = {}
    times: dict[str, list[float]] = {}
    peaks: dict[str, list[int]] = {}
    losses: dict[str, float] = {}
    for spec in job["specs"]:
        dist.barrier()
        before = mem("now")
        try:
            c = build(spec, shape, world)
            for s in range(steps):  # warm-up round: lazy optimizer state, buffers
                c.step(*data[s])
        except Exception as e:  # a contender that cannot run here is reported, not fatal
            errors[spec.name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            continue
        live[spec.name] = c
        held[spec.name] = mem("now") - before
        times[spec.name], peaks[spec.name] = [], []
    names = list(live)
    for rnd in range(rounds):
        for name in rotated(names, rnd):
            c = live[name]
            dist.barrier()
            mem("reset")
            before = mem("now")
            t0 = time.perf_counter()
            for s in range(steps):
                losses[name] = c.step(*data[s])
            if cuda:
                torch.cuda.synchronize()
            dist.barrier()
            times[name].append((time.perf_counter() - t0) / steps)
            peaks[name].append(mem("peak") - before)
    if rank == 0:
        out.put(
            {
                "times": times,
                "peaks": peaks,
                "held": held,
                "losses": losses,
                "errors": errors,
                "model_state": {n: c.model_state() for n, c in live.items()},
            }
        )
    dist.destroy_process_group()


def run_ranks(job: dict[str, Any], world: int = 2, timeout: float = 1800) -> dict[str, Any]:
    import multiprocessing as mp

    os.environ.update(MALLOC_ENV)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, job, out)) for r in range(world)]
    for p in procs:
        p.start()
    import queue

    deadline = time.monotonic() + timeout
    try:
        while True:  # a rank that dies leaves nothing in the queue: notice it, do not hang
            try:
                result: dict[str, Any] = out.get(timeout=5)
                break
            except queue.Empty:
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"engine bench ranks failed (exit codes {dead})") from None
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return result


def psi_of(shape: dict[str, int]) -> int:
    from bench.contenders import build_model

    return sum(p.numel() for p in build_model(shape).parameters())


def formula_bytes(psi: int, stage: str, world: int) -> int:
    from zeroscope.state.formulas import model_state_bytes

    offload = "cpu" if stage.endswith("+offload") else "none"
    m = model_state_bytes(
        psi,
        world,
        int(stage[0]),
        "fp32",
        offload_optimizer=offload,
        offload_param=offload if stage.startswith("3") else "none",
    )
    return int(m.params + m.grads + m.optim + m.host_params + m.host_grads + m.host_optim)


def table(
    title: str, shape: dict[str, Any], contenders: list[Spec], result: dict[str, Any], world: int
) -> Table:
    """Rows by stage: each contender's median step, the zeroscope/this paired ratio, memory."""
    psi = psi_of(shape)
    t = Table(
        title=title,
        columns=[
            "stage",
            "contender",
            "step ms",
            "zeroscope / this",
            "reading",
            "held MiB",
            "step peak MiB",
            "P+G+O MiB (reported / formula)",
            "last loss",
        ],
    )
    times, mib = result["times"], 2.0**20
    # The A/A control's spread sets how far from 1 a ratio must be to count as a win or a loss.
    aa = next((s for s in contenders if s.kind == "aa" and s.name in times), None)
    first = next(
        (
            s
            for s in contenders
            if aa and s.stage == aa.stage and s.family == "zeroscope" and s.kind != "aa"
        ),
        None,
    )
    first = first if first is not None and first.name in times else None
    noise = paired_ratio(times[first.name], times[aa.name]) if aa and first else None
    tolerance = max(0.03, abs(noise - 1)) if noise is not None else 0.03
    for spec in contenders:
        if spec.name in result["errors"]:
            t.add(
                spec.stage,
                spec.name,
                None,
                None,
                "failed: " + result["errors"][spec.name],
                None,
                None,
                None,
                None,
            )
            continue
        mine = next(
            (
                s.name
                for s in contenders
                if s.stage == spec.stage
                and s.family == "zeroscope"
                and s.kind != "aa"
                and s.name in times
            ),
            None,
        )
        ratio: Any = (
            "—"
            if mine == spec.name
            else None
            if mine is None
            else paired_ratio(times[mine], times[spec.name])
        )
        state = None
        if spec.family == "zeroscope":
            got, want = result["model_state"][spec.name], formula_bytes(psi, spec.stage, world)
            state = f"{cell(got / mib, 3)} / {cell(want / mib, 3)}"
        step = median(times[spec.name])
        t.add(
            spec.stage,
            spec.name,
            None if step is None else step * 1e3,
            ratio,
            "—"
            if mine == spec.name
            else "A/A control: the noise floor"
            if spec.kind == "aa"
            else f"zeroscope {verdict(ratio, tolerance=tolerance)}",
            result["held"][spec.name] / mib,
            (median(result["peaks"][spec.name]) or 0) / mib,
            state,
            cell(result["losses"].get(spec.name), 4),
        )
    t.note = (
        f"Model: examples/train_gpt.py's TinyGPT, vocab {shape['vocab']}, width {shape['width']}, "
        f"{shape['layers']} layers, {shape['heads']} heads, context {shape['block']}, "
        f"micro-batch {shape['batch']}/rank: {psi:,} parameters. {world} ranks, fp32, "
        "AdamW, clip 1.0; same weights and batches for all (equal last losses check it). "
        "held = resident-set (GPU: allocated) growth from building the contender through its "
        "warm-up round; step peak = peak growth over one step above the level before it; "
        "P+G+O = the engine's own exact report (host parts included) beside zeroscope.state.formulas. "
        f"'par' = within {tolerance * 100:.0f}% (the A/A control's distance from 1, at least 3%)."
    )
    return t


def run(
    title: str,
    shape: dict[str, Any],
    families: set[str],
    rounds: int,
    steps: int,
    *,
    world: int = 2,
    only_stages: set[str] | None = None,
) -> Table:
    contenders = [s for s in specs(families) if only_stages is None or s.stage in only_stages]
    job = {"shape": shape, "specs": contenders, "rounds": rounds, "steps": steps}
    return table(title, shape, contenders, run_ranks(job, world), world)
