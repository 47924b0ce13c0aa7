"""Step time of every offload mode of zeroscope's engine beside no offload, and beside DeepSpeed's
ZeRO-2 offload_optimizer (its compiled CPU Adam) on the same model, in the same run: 2 gloo ranks
on CPU, contenders alternating round by round (the order rotates), medians, ratios against the
engine's stage 2 without offload.

    PYTHONPATH=. python bench/offload.py [--rounds 7] [--steps 3] [--dim 128] [--layers 4]
    PYTHONPATH=. python bench/offload.py --no-deepspeed      # without the DeepSpeed contenders
    PYTHONPATH=. python bench/offload.py --cold-reads        # NVMe reads from the drive each time

DeepSpeed runs with DS_ACCELERATOR=cpu on the already-initialized gloo group; its first use
compiles CPU Adam (minutes), then the build is cached. If it cannot run, the reason is printed
in the table instead of a time.

Times: wall-clock per step (what a user waits for) and rank 0's process CPU time per step (all
its threads; steadier than wall time on a shared, loaded machine). Beside the time: the engine's
own bytes (device O and host O per rank, from MemoryBytes) and
the offload bandwidth from its transfer reports (bytes / summed transfer time, per direction).
On a CPU-only machine "device" and "host" are both RAM: the copies are real and measured, but
their GB/s is memcpy bandwidth, not PCIe (docs/offload.md).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_stages import build_model

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _modes(nvme: str) -> dict[str, dict[str, Any]]:
    nv = {"device": "nvme", "nvme_path": nvme}
    units = {"sub_group_size": 100_000}  # ~5 swap units per rank: reads ahead, writes behind
    return {
        "s2": {"stage": 2},
        "s2+opt-cpu": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "s2+opt-nvme": {"stage": 2, "offload_optimizer": nv, **units},
        "s3": {"stage": 3},
        "s3+opt-cpu": {"stage": 3, "offload_optimizer": {"device": "cpu"}},
        "s3+opt-nvme": {"stage": 3, "offload_optimizer": nv, **units},
        "s3+opt+param-cpu": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu"},
            "offload_param": {"device": "cpu"},
        },
        "s3+opt+param-nvme": {
            "stage": 3,
            "offload_optimizer": nv,
            "offload_param": nv,
            **units,
        },
    }


DEEPSPEED = ["deepspeed-s2", "deepspeed-s2+opt-cpu"]


def _ds_config(args: argparse.Namespace, zero: dict[str, Any]) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": args.batch,
        "steps_per_print": 10**9,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}},
    }


class Transfers:
    """A Telemetry that sums transfer bytes and seconds per direction."""

    def __init__(self) -> None:
        from zeroscope.agent.api import Telemetry

        class _Tel(Telemetry):
            def __init__(inner) -> None:
                inner.bytes: dict[str, int] = defaultdict(int)
                inner.ns: dict[str, int] = defaultdict(int)

            def transfer(
                inner, direction: Any, nbytes: int, s: int, e: int, label: str = "", **_: Any
            ) -> None:
                inner.bytes[direction] += nbytes
                inner.ns[direction] += e - s

        self.tel = _Tel()


class EngineContender:
    def __init__(self, args: argparse.Namespace, zero: dict[str, Any]) -> None:
        from zeroscope.agent.api import set_telemetry
        from zeroscope.engine.api import initialize

        self.transfers = Transfers()
        set_telemetry(self.transfers.tel)
        model = build_model(args)
        self.engine, *_ = initialize(model=model, config=_ds_config(args, zero))
        set_telemetry(None)

    def step(self, idx: Any, tgt: Any) -> float:
        loss = self.engine(idx, tgt)
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.detach())

    def figures(self) -> dict[str, Any]:
        m = self.engine.strategy.memory()
        tel = self.transfers.tel
        bw = {d: tel.bytes[d] / (tel.ns[d] / 1e9) / 1e9 for d in tel.bytes if tel.ns[d] > 0}
        return {"optim": m.optim, "host_optim": m.host_optim, "nvme": m.nvme_bytes, "gbps": bw}


class DeepSpeedContender:
    def __init__(self, args: argparse.Namespace, offload: bool) -> None:
        import deepspeed

        model = build_model(args)
        zero: dict[str, Any] = {"stage": 2}
        cfg = _ds_config(args, zero)
        if offload:
            zero["offload_optimizer"] = {"device": "cpu"}
        else:
            cfg["optimizer"]["params"]["torch_adam"] = True  # no FusedAdam on CPU
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )

    def step(self, idx: Any, tgt: Any) -> float:
        loss = self.engine(idx, tgt)
        self.engine.backward(loss)
        self.engine.step()
        return float(loss.detach())

    def figures(self) -> dict[str, Any]:
        return {}


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    nvme = tempfile.mkdtemp(prefix="zeroscope-bench-nvme-")
    contenders: dict[str, Any] = {n: EngineContender(args, z) for n, z in _modes(nvme).items()}
    failed: dict[str, str] = {}
    if args.deepspeed:
        for name in DEEPSPEED:
            try:
                contenders[name] = DeepSpeedContender(args, offload="opt-cpu" in name)
            except Exception as exc:  # record why, keep benchmarking the rest
                failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    names = list(contenders)
    g = torch.Generator().manual_seed(1 + rank)
    data = torch.randint(0, args.vocab, (args.steps, args.batch, args.seq + 1), generator=g)
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    for rnd in range(args.rounds + 1):  # round 0 warms up and is dropped
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for name in order:
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for s in range(args.steps):
                losses[name] = contenders[name].step(data[s, :, :-1], data[s, :, 1:])
            dist.barrier()
            if rnd:
                times[name].append((time.perf_counter() - t0) / args.steps)
                cpu[name].append((time.process_time() - c0) / args.steps)
    if rank == 0:
        out.put(
            {
                "psi": sum(p.numel() for p in build_model(args).parameters()),
                "time": {n: statistics.median(v) for n, v in times.items()},
                "cpu": {n: statistics.median(v) for n, v in cpu.items()},
                "figures": {n: c.figures() for n, c in contenders.items()},
                "loss": losses,
                "failed": failed,
            }
        )
    for c in contenders.values():
        if isinstance(c, EngineContender):
            c.engine.destroy()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3, help="steps per contender per round")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-deepspeed", dest="deepspeed", action="store_false")
    parser.add_argument(
        "--cold-reads",
        action="store_true",
        help="every NVMe read drops the file's cached pages first: the drive's read GB/s "
        "(training reads may be served from the page cache; slower steps)",
    )
    args = parser.parse_args(argv)
    if args.cold_reads:
        os.environ["ZEROSCOPE_NVME_COLD_READS"] = "1"  # engine/nvme.py; the spawned ranks inherit
    import multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    import queue

    while True:  # never wait forever on a rank that died
        try:
            result = out.get(timeout=5)
            break
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                print(f"a rank exited with code {dead[0]}; see its traceback above")
                return 1
    for p in procs:
        p.join()
    base = result["time"]["s2"]
    print(
        f"small GPT: {result['psi']:,} parameters, 2 gloo ranks on CPU, fp32, AdamW, "
        f"{args.rounds} rounds x {args.steps} steps, medians\n"
    )
    print(
        "| contender | step ms | vs s2 | CPU ms | vs s2 | device O KiB | host O KiB | NVMe KiB "
        "| GB/s by direction |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    cpu_base = result["cpu"]["s2"]
    for name, seconds in result["time"].items():
        f = result["figures"][name]

        def kib(key: str, f: dict[str, Any] = f) -> str:
            return f"{f[key] / 1024:.0f}" if f else "n/a"

        bw = ", ".join(f"{d} {v:.2f}" for d, v in sorted(f.get("gbps", {}).items())) or "-"
        print(
            f"| {name} | {seconds * 1e3:.1f} | {seconds / base:.2f} | "
            f"{result['cpu'][name] * 1e3:.1f} | {result['cpu'][name] / cpu_base:.2f} | {kib('optim')} | "
            f"{kib('host_optim')} | {kib('nvme')} | {bw} |"
        )
    for name, why in result["failed"].items():
        print(f"| {name} | failed: {why} | | | | | | | |")
    print("\nlast losses:", {n: round(v, 4) for n, v in result["loss"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
