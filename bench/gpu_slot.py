"""One prepared script for a single-GPU loan (one GPU, about five minutes): what the engine and the
agent do on CUDA, measured in one go, written to one JSON file plus a short table.

    python -m bench.gpu_slot --out gpu-slot.json              # on the GPU machine
    python -m bench.gpu_slot --dry-run --out /tmp/slot.json   # the same script on the CPU

NCCL runs at world 1 through the engine's own init (``ZEROSCOPE_WORLD1_COLLECTIVES=1``: the engine
issues its real collectives with one rank; ``TORCH_NCCL_ENABLE_TIMING=1`` so NCCL times its own
work). Sections, in order (each is skipped, and says so, once ``--budget-s`` is spent):

1. identity: torch's GPU (name, UUID, PCI id) beside NVML's device found by that UUID; the PCIe
   link's current and maximum speed and width;
2. copies: pinned and pageable H2D/D2H GB/s timed with CUDA events, and the engine's own timing
   of a bf16 parameter update through its pinned staging (engine/offload_copy.py);
3. the engine matrix: stages 0-3 x fp32/bf16/fp16 x overlap_comm on/off x offload (none, cpu;
   nvme with ``--nvme PATH``) under the live agent, with ``torch.cuda.set_sync_debug_mode("warn")``
   counting device synchronizations per steady step (inside the engine's calls only), the step
   time, the device peak, P/G/O as reported, and the collectives and transfers the agent saw;
4. a large all-reduce alone and with compute queued beside it: the agent's duration and exposed
   time against ``work._get_duration()``;
5. agent on/off: step time with the live agent against none (paired rounds, with an A/A control);
6. the collective-timing semantics (bench/gpu_semantics.py): overlapped and waited-at-once
   all-reduces against a known sleep, the duration's clock, a freed buffer reused at once.

On the CPU (``--dry-run``, or no CUDA) every section runs with tiny sizes on gloo; GPU-only
figures are None (NA). tests/test_gpu_slot.py runs the dry run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import Table, machine_description, paired_ratio, render_table  # noqa: E402

FULL: dict[str, Any] = {
    "shape": {"vocab": 8192, "block": 256, "width": 768, "layers": 6, "heads": 12},
    "batch": 8,
    "copy_bytes": 256 * 2**20,
    "allreduce_bytes": 512 * 2**20,
    "repeats": 5,
    "overhead_rounds": 6,
}
DRY: dict[str, Any] = {
    "shape": {"vocab": 256, "block": 16, "width": 32, "layers": 2, "heads": 2},
    "batch": 2,
    "copy_bytes": 2**20,
    "allreduce_bytes": 2**20,
    "repeats": 2,
    "overhead_rounds": 2,
}
WARMUP, MEASURED = 2, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="gpu-slot.json", help="where the JSON goes")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes (also without CUDA)")
    p.add_argument("--budget-s", type=float, default=270.0, help="stop starting sections after")
    p.add_argument("--nvme", default=None, help="a folder for the nvme rows of the matrix")
    return p.parse_args(argv)


def _config(stage: int, precision: str, overlap: bool, offload: str, nvme: str | None) -> dict:
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": overlap}
    if stage == 3:
        zero["stage3_param_persistence_threshold"] = 10_000
    if offload != "none":
        zero["offload_optimizer"] = {"device": offload, "nvme_path": nvme}
        if stage == 3:
            zero["offload_param"] = {"device": offload, "nvme_path": nvme}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 0,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
    }
    if precision != "fp32":
        cfg[precision] = {"enabled": True}
    return cfg


class Syncs:
    """Counts device synchronizations inside a block (the engine's calls): the
    ``set_sync_debug_mode("warn")`` warnings (blocking copies, ``.item()``...) plus every
    ``torch.cuda.synchronize``, ``Event.synchronize`` and ``Stream.synchronize`` call, which
    sync-debug mode does not flag (an offload step's event waits would go uncounted)."""

    def __init__(self) -> None:
        self.count = 0
        self.explicit = 0

    def __enter__(self) -> Syncs:
        import torch

        self._ctx = warnings.catch_warnings(record=True)
        self._seen = self._ctx.__enter__()
        warnings.simplefilter("always")
        self._restore: list[tuple[Any, str, Any]] = []
        for owner, name in (
            (torch.cuda, "synchronize"),
            (torch.cuda.Event, "synchronize"),
            (torch.cuda.Stream, "synchronize"),
        ):
            real = getattr(owner, name)
            self._restore.append((owner, name, real))
            setattr(owner, name, self._counting(real))
        return self

    def _counting(self, real: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.explicit += 1
            return real(*args, **kwargs)

        return counted

    def __exit__(self, *exc: Any) -> None:
        for owner, name, real in self._restore:
            setattr(owner, name, real)
        self.count += sum("synchroniz" in str(w.message) for w in self._seen) + self.explicit
        self._ctx.__exit__(*exc)


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()  # the bench's own clock, outside the counted calls


def _one_config(name: str, cfg: dict, size: dict, device: Any, agent: Any) -> dict[str, Any]:
    import torch

    from bench.contenders import build_model
    from zeroscope.engine.api import initialize

    row: dict[str, Any] = {"config": name}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    engine, *_ = initialize(model=build_model(size["shape"], str(device)), config=cfg)
    _sync(device)
    row["init_s"] = time.perf_counter() - t0
    batch, block, vocab = size["batch"], size["shape"]["block"], size["shape"]["vocab"]
    x = torch.randint(0, vocab, (batch, block), device=device)
    first_step = agent.step
    times, syncs, losses = [], [], []
    for step in range(WARMUP + MEASURED):
        _sync(device)
        t = time.perf_counter()
        with Syncs() as counted:
            loss = engine(x, x)
            engine.backward(loss)
            engine.step()
        _sync(device)
        if step == 0:
            row["loop_first_step_s"] = time.perf_counter() - t
        if step >= WARMUP:
            times.append(time.perf_counter() - t)
            syncs.append(counted.count if cuda else None)
        losses.append(loss.detach())
    row["steps"] = (first_step, agent.step)
    row["step_ms"] = statistics.median(times) * 1e3
    row["syncs_per_steady_step"] = syncs
    row["loss"] = float(losses[-1])
    row["device_peak_MiB"] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    row["device_reserved_MiB"] = torch.cuda.max_memory_reserved() / 2**20 if cuda else None
    m = engine.strategy.memory()
    row["reported_MiB"] = {
        k: getattr(m, k) / 2**20
        for k in ("params", "grads", "optim", "host_params", "host_grads", "host_optim")
    }
    row["host_pinned_MiB"] = None if m.host_pinned is None else m.host_pinned / 2**20
    engine.destroy()
    return row


def engine_matrix(size: dict, device: Any, agent: Any, deadline: float, nvme: str | None) -> list:
    offloads = ["none", "cpu"] + (["nvme"] if nvme else [])
    rows = []
    for stage in (0, 1, 2, 3):
        for precision in ("fp32", "bf16", "fp16"):
            for overlap in (True, False):
                for offload in ("none",) if stage == 0 else offloads:
                    name = f"s{stage} {precision} overlap={'on' if overlap else 'off'} {offload}"
                    if time.monotonic() > deadline:
                        rows.append({"config": name, "skipped": "budget spent"})
                        continue
                    cfg = _config(stage, precision, overlap, offload, nvme)
                    try:
                        rows.append(_one_config(name, cfg, size, device, agent))
                    except Exception as exc:
                        rows.append({"config": name, "error": f"{type(exc).__name__}: {exc}"})
    return rows


def reserved_on_off(size: dict, device: Any, agent: Any) -> dict[str, Any]:
    """Peak ``memory_reserved`` of one stage-3 config without the agent, with it, and without
    again (the A/A control): the agent must hold no collective's memory (a future callback
    that records its outputs on another stream parks every freed gather buffer)."""
    if device.type != "cuda":
        return {"why": "no CUDA"}
    from zeroscope.agent.api import NullTelemetry, set_telemetry

    cfg = _config(3, "bf16", True, "none", None)
    peaks: dict[str, Any] = {}
    try:
        for name, reporter in (("off", NullTelemetry()), ("on", agent), ("off again", None)):
            set_telemetry(reporter or NullTelemetry())
            peaks[name] = _one_config(f"s3 reserved {name}", cfg, size, device, agent)[
                "device_reserved_MiB"
            ]
    finally:
        set_telemetry(agent)
    return peaks


def _attach_reports(rows: list, reports: list) -> None:
    """Per config: what the agent reported for its measured steps."""
    for row in rows:
        if "steps" not in row:
            continue
        lo, hi = row.pop("steps")
        if lo == 1:  # the agent's step 1 is this config's first step
            row["agent_step1_s"] = next((r.duration_s for r in reports if r.step == 1), None)
        mine = [r for r in reports if lo + WARMUP <= r.step < hi]
        row["agent_collectives_per_step"] = [len(r.collectives) for r in mine]
        row["agent_comm_bytes_per_step"] = [sum(c.nbytes for c in r.collectives) for r in mine]
        moved = [t for r in mine for t in r.transfers if t.duration_s > 0]
        row["agent_transfer_GBps"] = (
            sum(t.nbytes for t in moved) / sum(t.duration_s for t in moved) / 1e9 if moved else None
        )
        row["agent_loss"] = mine[-1].loss if mine else None


def agent_overhead(size: dict, device: Any, agent: Any, rounds: int) -> dict[str, Any]:
    """Step time of the same engine config without and with the live agent, and an A/A pair."""
    import torch

    from bench.contenders import build_model
    from zeroscope.agent.api import NullTelemetry, set_telemetry
    from zeroscope.engine.api import initialize

    cfg = _config(2, "bf16", True, "none", None)
    engines = {}
    for name, tel in (("off", NullTelemetry()), ("off again", NullTelemetry()), ("on", agent)):
        set_telemetry(tel)
        engines[name], *_ = initialize(model=build_model(size["shape"], str(device)), config=cfg)
    x = torch.randint(0, size["shape"]["vocab"], (size["batch"], size["shape"]["block"]))
    x = x.to(device)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(rounds + 1):
        for name in list(engines)[r % 3 :] + list(engines)[: r % 3]:
            _sync(device)
            t = time.perf_counter()
            for _ in range(3):
                loss = engines[name](x, x)
                engines[name].backward(loss)
                engines[name].step()
            _sync(device)
            if r:
                times[name].append((time.perf_counter() - t) / 3)
    return {
        "step_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
        "on / off": paired_ratio(times["on"], times["off"]),
        "A/A (off again / off)": paired_ratio(times["off again"], times["off"]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")  # before the process group exists
    os.environ["ZEROSCOPE_WORLD1_COLLECTIVES"] = "1"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)  # one rank: the engine makes its own group

    import torch

    from bench import gpu_checks as checks
    from bench import gpu_semantics
    from bench.gpu_offload_checks import offload_and_device_verdicts
    from bench.gpu_placement import placement_verdicts
    from bench.gpu_probes import allreduce_overlap, copy_bandwidth, identity
    from zeroscope.agent.api import set_telemetry
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.publish import Publisher
    from zeroscope.agent.schema import MemoryBytes, StepReport
    from zeroscope.collector.server import Collector, wait_for
    from zeroscope.engine.process_group import Comm, init_distributed, pick_device

    dry = args.dry_run or not torch.cuda.is_available()
    size = DRY if dry else FULL
    device = torch.device("cpu") if dry else pick_device()
    deadline = time.monotonic() + args.budget_s
    out: dict[str, Any] = {"dry_run": dry, "machine": machine_description(), "sizes": size}
    out["identity"] = identity() if not dry else {"why": "dry run"}
    out["copies"] = copy_bandwidth(device, size["copy_bytes"], size["repeats"])
    got: list[Any] = []
    with Collector() as col:
        col.add_listener(got.append)
        agent = LiveTelemetry(Publisher(col.ingest_address), job_id="gpu-slot")
        set_telemetry(agent)
        init_distributed(device)
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        try:
            out["matrix"] = engine_matrix(size, device, agent, deadline, args.nvme)
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode(0)
        out["reserved"] = reserved_on_off(size, device, agent)
        first = agent.step
        comm = Comm.data_parallel(agent, device)
        out["allreduce"] = allreduce_overlap(comm, device, size["allreduce_bytes"], agent)
        out["semantics"] = gpu_semantics.probe(comm, device, agent)
        cuda = device.type == "cuda"
        out["checks"] = [
            checks.guarded("too few GPUs", lambda: checks.too_few_gpus(cuda)),
            checks.guarded("cpu tier", lambda: checks.cpu_tier_hides_cuda(cuda)),
            checks.guarded("profile", lambda: checks.profile_partition(device)),
            checks.guarded("sync op", lambda: checks.synchronous_collective(agent, device)),
            checks.guarded("capture", lambda: checks.graph_capture(agent, device)),
            checks.guarded("linear", lambda: checks.biased_linear_autocast(device)),
        ]
        agent.step_end(memory=MemoryBytes())  # the checks' own step
        out["placement"] = placement_verdicts(device)
        out["offload_checks"] = offload_and_device_verdicts(device)
        if time.monotonic() < deadline:
            out["agent_overhead"] = agent_overhead(size, device, agent, size["overhead_rounds"])
        else:
            out["agent_overhead"] = {"skipped": "budget spent"}
        agent.close()
        wait_for(lambda: any(type(m).__name__ == "Bye" for m in got), timeout=10)
    reports = [m for m in got if isinstance(m, StepReport)]
    _attach_reports(out["matrix"], reports)
    for r in reports:
        if r.step < first:
            continue
        for c in r.collectives:
            if c.label.startswith("bench "):
                row = out["allreduce"][c.label.removeprefix("bench ")]
                row.update(agent_duration_s=c.duration_s, agent_exposed_s=c.exposed_s)
    gpu_semantics.take_reports(out["semantics"], reports)
    out["agent_errors"] = agent.errors
    out["verdicts"] = verdicts(out)
    return out


def verdicts(out: dict[str, Any]) -> list[dict[str, Any]]:
    """The PASS/FAIL/NA table: the readiness items, then the timing semantics."""
    from bench import gpu_checks as checks
    from bench import gpu_semantics

    cuda = not out["dry_run"]
    rows = out["matrix"]
    ok = [r for r in rows if "step_ms" in r]
    failed = [r["config"] for r in rows if "error" in r]
    same_loss = all(
        math.isfinite(r["loss"])
        and r.get("agent_loss") is not None
        and math.isclose(r["agent_loss"], r["loss"], rel_tol=1e-5)
        for r in ok
    )
    return [
        *out["checks"],
        *out.get("placement", []),
        *out.get("offload_checks", []),
        checks.step_one(rows),
        checks.verdict("every engine config runs", not failed, failed[:4] or f"{len(ok)} ran"),
        checks.verdict("every loss finite, the agent's the engine's", same_loss, len(ok)),
        checks.verdict("agent counted no errors", out["agent_errors"] == 0, out["agent_errors"]),
        checks.offload_syncs(rows, cuda),
        checks.reserved_on_off(out.get("reserved", {})),
        *checks.allreduce_timing(out["allreduce"], cuda),
        checks.agent_overhead(out["agent_overhead"]),
        *gpu_semantics.verdicts(out.get("semantics", {}), cuda),
    ]


def verdict_table(out: dict[str, Any]) -> Table:
    t = Table(title="GPU slot verdicts", columns=["check", "verdict", "seen"])
    for v in out["verdicts"]:
        t.add(v["item"], v["verdict"], json.dumps(v["seen"], default=str)[:120])
    return t


def table(out: dict[str, Any]) -> Table:
    t = Table(
        title="GPU slot" + (" (dry run, CPU)" if out["dry_run"] else ""), columns=["what", "value"]
    )
    ident = out["identity"]
    t.add("torch / NVML same device", ident.get("same_device"))
    t.add("PCIe link current / max", f"{ident.get('link_current')} / {ident.get('link_max')}")
    c = out["copies"]
    for k in ("pinned_h2d", "pinned_d2h", "pageable_h2d", "pageable_d2h", "engine_bf16_h2d"):
        t.add(f"{k} GB/s", c.get(f"{k}_GBps"))
    rows = out["matrix"]
    ok = [r for r in rows if "step_ms" in r]
    t.add("engine configs ok / run", f"{len(ok)} / {len(rows)}")
    failed = [r["config"] for r in rows if "error" in r]
    t.add("failed configs", ", ".join(failed) or "none")
    syncs = [s for r in ok for s in r["syncs_per_steady_step"] if s is not None]
    t.add("max syncs per steady step", max(syncs) if syncs else None)
    finite = all(math.isfinite(r["loss"]) for r in ok)
    t.add("all losses finite", finite)
    for name in ("alone", "with compute"):
        a = out["allreduce"].get(name, {})
        t.add(
            f"all-reduce {name}: agent s / work s",
            f"{a.get('agent_duration_s')} / {a.get('work_duration_s')}",
        )
    o = out["agent_overhead"]
    t.add("agent on / off step time", o.get("on / off"))
    t.add("A/A control", o.get("A/A (off again / off)"))
    return t


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = run(args)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(render_table(table(out)))
    print(render_table(verdict_table(out)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
