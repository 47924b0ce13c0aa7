"""The GPU-readiness checks of bench/gpu_slot.py, one function per item, each a verdict: PASS,
FAIL (with what was seen), or NA (with why: the check needs a GPU, or two).

Each check asserts the semantics its GPU-marked test asserts (tests/test_cuda_init.py,
test_cpu_tier.py, test_profile_partition.py, test_agent_sync_collective.py,
test_agent_capture.py, test_zero3_linear_autocast.py, test_agent_step_one.py), small enough that
all of them take seconds. A check that raises is a FAIL naming the exception, never a crash of
the slot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

Verdict = dict[str, Any]
"""``{"item": ..., "verdict": "PASS" | "FAIL" | "NA", "seen": ...}``."""


def verdict(item: str, ok: bool | None, seen: Any) -> Verdict:
    return {"item": item, "verdict": "NA" if ok is None else "PASS" if ok else "FAIL", "seen": seen}


def guarded(item: str, check: Callable[[], Verdict]) -> Verdict:
    try:
        return check()
    except Exception as exc:  # a broken check is a finding, not the end of the slot
        return verdict(item, False, f"{type(exc).__name__}: {exc}")


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def too_few_gpus(cuda: bool) -> Verdict:
    """More local ranks than GPUs stop with one TooFewGpus line, before any work."""
    item = "more local ranks than GPUs stop with one line"
    if not cuda:
        return verdict(item, None, "no GPU (tests/test_cuda_init.py mocks the count)")
    import torch

    count = torch.cuda.device_count()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(LOCAL_RANK=str(count), LOCAL_WORLD_SIZE=str(count + 1))
    proc = _python("from zeroscope.engine.process_group import pick_device; pick_device()", env)
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    ok = proc.returncode != 0 and last.startswith("zeroscope.engine.process_group.TooFewGpus")
    return verdict(item, ok, last[:160])


def cpu_tier_hides_cuda(cuda: bool) -> Verdict:
    """What the CPU test tiers set (CUDA_VISIBLE_DEVICES='') makes the engine pick the CPU."""
    item = "CPU tiers see no GPU"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", LOCAL_RANK="0")
    code = "from zeroscope.engine.process_group import pick_device; print(pick_device())"
    proc = _python(code, env)
    seen = proc.stdout.strip() or proc.stderr.strip()[-160:]
    return verdict(item, seen == "cpu" if cuda else None if seen == "cpu" else False, seen)


def profile_partition(device: Any) -> Verdict:
    """partition_method='profile' broadcasts its layer times over the (world-1) group."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from zeroscope.engine.parallel.profile import profiled_weights

    item = "profile partition broadcasts on the group's device"
    if not dist.is_initialized():
        return verdict(item, None, "no process group")
    layers = [nn.Linear(64, 64).to(device) for _ in range(3)]
    x = torch.zeros(4, 64, device=device)
    times = profiled_weights(lambda: layers, x, repeats=1, device=device)
    return verdict(item, len(times) == 3 and all(t > 0 for t in times), times)


def synchronous_collective(agent: Any, device: Any) -> Verdict:
    """tel.collective(None) (a blocking op) is recorded and its wait() returns."""
    import torch
    import torch.distributed as dist

    item = "synchronous collective through the agent"
    t = torch.ones(256, device=device)
    work = dist.all_reduce(t) if dist.is_initialized() else None
    before = agent.errors
    got = agent.collective(work, op="all_reduce", nbytes=1024, group_size=1, label="check sync")
    got.wait()
    return verdict(item, agent.errors == before, {"wait": "returned", "errors": agent.errors})


def graph_capture(agent: Any, device: Any) -> Verdict:
    """A CUDA graph captured with the agent's phase inside it, in the default global mode."""
    import torch

    from zeroscope.agent.capture import SAID

    item = "CUDA graph capture with the agent"
    if device.type != "cuda":
        return verdict(item, None, "no GPU (tests/test_agent_capture.py drives a stub)")
    model = torch.nn.Linear(256, 256).to(device)
    x = torch.randn(16, 256, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    before = agent.errors
    said: list[str] = []
    event = agent.event
    agent.event = lambda kind, message="", value=None: (
        said.append(message),
        event(kind, message, value),
    )
    try:
        with torch.cuda.graph(graph), agent.phase("forward"):
            y = model(x)
    finally:
        del agent.event
    graph.replay()
    torch.cuda.synchronize()
    ok = agent.errors == before and torch.allclose(y, model(x), atol=1e-4)
    return verdict(item, ok and SAID in said, {"errors": agent.errors - before, "said": said})


def biased_linear_autocast(device: Any) -> Verdict:
    """Stage 3's Linear with a bias keeps the autocast dtype, as F.linear does."""
    import copy

    import torch

    from zeroscope.engine.zero.stage3.linear import patch_linears, unpatch_linears

    item = "stage-3 biased Linear keeps the autocast dtype"
    ref = torch.nn.Linear(64, 64).to(device)
    z3 = copy.deepcopy(ref)
    patched = patch_linears(z3)
    x = torch.randn(4, 3, 64, device=device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        want, got = ref(x), z3(x)
    unpatch_linears(patched)
    seen = {"stage 0": str(want.dtype), "stage 3": str(got.dtype)}
    return verdict(item, got.dtype == want.dtype, seen)


def step_one(rows: list[dict[str, Any]]) -> Verdict:
    """The agent's step 1 lasts no longer than the loop's own first step: it starts at the
    loop's first phase, not at the first init broadcast inside ``initialize()``. Only the first
    config's first step is the agent's step 1 (later configs are built between steps)."""
    item = "step 1 excludes initialize()"
    first = next((r for r in rows if r.get("agent_step1_s") is not None), None)
    if first is None:
        return verdict(item, None, "no step-1 report")
    agent_s, loop_s = first["agent_step1_s"], first["loop_first_step_s"]
    seen = {"agent step 1 s": agent_s, "loop first step s": loop_s, "init s": first["init_s"]}
    return verdict(item, agent_s <= loop_s, seen)


def allreduce_timing(allreduce: dict[str, Any], cuda: bool) -> list[Verdict]:
    """The agent's all-reduce duration against NCCL's own (``work._get_duration()``)."""
    out = []
    for name in ("alone", "with compute"):
        a = allreduce.get(name, {})
        agent_s, work_s = a.get("agent_duration_s"), a.get("work_duration_s")
        item = f"all-reduce {name}: agent duration within 0.5-2x of NCCL's"
        if not cuda or agent_s is None or work_s is None:
            out.append(verdict(item, None, "no NCCL timing" if cuda else "no GPU"))
            continue
        out.append(verdict(item, 0.5 <= agent_s / work_s <= 2.0, (agent_s, work_s)))
    return out


def agent_overhead(overhead: dict[str, Any]) -> Verdict:
    ratio, control = overhead.get("on / off"), overhead.get("A/A (off again / off)")
    item = "agent on/off step time <= 1.05 (A/A control within 1.05)"
    if ratio is None or control is None:
        return verdict(item, None, overhead.get("skipped", "not measured"))
    if abs(control - 1.0) > 0.05:
        return verdict(item, None, f"A/A {control:.3f}: too noisy to judge")
    return verdict(item, ratio <= 1.05, round(ratio, 3))


def offload_syncs(rows: list[dict[str, Any]], cuda: bool) -> Verdict:
    """Every cpu-offload config shows the event synchronizations it takes (the copier's flush
    waits on a CUDA event each step; sync-debug warnings alone never flag one)."""
    item = "offload syncs counted (event synchronize included)"
    if not cuda:
        return verdict(item, None, "no GPU")
    offload = [r for r in rows if r["config"].endswith(" cpu") and "syncs_per_steady_step" in r]
    if not offload:
        return verdict(item, None, "no cpu-offload config ran")
    low = [r["config"] for r in offload if min(r["syncs_per_steady_step"]) < 1]
    counts = {r["config"]: r["syncs_per_steady_step"] for r in offload[:2]}
    return verdict(item, not low, low or counts)


def reserved_on_off(peaks: dict[str, Any]) -> Verdict:
    """The agent holds no memory: a stage-3 run's peak ``memory_reserved`` with it within 1%
    of without (and the A/A control, without twice, within 1% too, or the figure means
    nothing)."""
    item = "stage-3 memory_reserved, agent on vs off, within 1%"
    if "off" not in peaks:
        return verdict(item, None, peaks.get("why", "not run"))
    off, on, again = peaks["off"], peaks["on"], peaks["off again"]
    control = abs(again - off) <= 0.01 * off
    if not control:
        return verdict(item, None, {"MiB": peaks, "why": "A/A control moved more than 1%"})
    return verdict(item, abs(on - off) <= 0.01 * off, {"MiB": peaks})
