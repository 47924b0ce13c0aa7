"""The collective-timing semantics of bench/gpu_slot.py, each a PASS/FAIL/NA verdict.

What a collective's figures must mean on a GPU (docs/engines/timing.md), measured through the
bundled engine's ``Comm`` under the live agent, against the device's own clock (CUDA events the
probe records itself around a known ``torch.cuda._sleep``):

- an all-reduce overlapped with the sleep lasts much less than the sleep (its duration is the
  op's own, torch's events on the NCCL stream) and is not exposed (the compute stream never
  stalled for it);
- an all-reduce waited on at once is all exposed (the compute stream's stall is the op);
- its duration is on the device clock;
- the agent holds nothing: a gather buffer freed after its ``wait()`` is reused by the next
  allocation of that size while the device is still busy (no ``recordStream`` parks it).

On the CPU (``--dry-run``) the probes run on gloo with tiny sizes and every verdict is NA.
"""

from __future__ import annotations

from typing import Any

import torch

from bench.gpu_checks import Verdict, verdict

SLEEP_CYCLES = 200_000_000
"""``torch.cuda._sleep`` cycles: ~0.1 s on current GPUs, far longer than a 1 MiB world-1 op."""


def _sleep_s(cycles: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()  # the probe may synchronize; the engine and the agent never do
    return start.elapsed_time(end) / 1e3


def probe(comm: Any, device: torch.device, agent: Any) -> dict[str, Any]:
    """Run the probes (one step each, labelled ``semantics ...``); the agent's figures are
    filled in by :func:`take_reports` once the reports are in."""
    from zeroscope.agent.schema import MemoryBytes

    cuda = device.type == "cuda"
    out: dict[str, Any] = {"sleep_s": _sleep_s(SLEEP_CYCLES) if cuda else None}
    buf = torch.ones(1 << 18, device=device)
    for name in ("overlapped", "at once"):
        handle = comm.all_reduce(buf, label=f"semantics {name}")
        if name == "overlapped" and cuda:
            torch.cuda._sleep(SLEEP_CYCLES)  # compute the all-reduce hides behind
        handle.wait()
        if cuda:
            torch.cuda.synchronize()
        agent.step_end(memory=MemoryBytes())
        out[name] = {}
    out["reuse"] = {"agent": None, "bare": None}
    if cuda:
        out["reuse"] = {"agent": _reused(comm, True), "bare": _reused(comm, False)}
        agent.step_end(memory=MemoryBytes())
    return out


def _reused(comm: Any, agent: bool) -> bool:
    """Whether a gather buffer freed right after its wait is the next allocation's, while the
    device is still busy: through the agent (``Comm``) or bare (torch's own Work), so that
    torch's own stream bookkeeping is the control, not counted against the agent."""
    import torch.distributed as dist

    shard = torch.ones(1 << 18, device="cuda")
    full = torch.empty(comm.world_size * shard.numel(), device="cuda")
    if agent:
        handle = comm.all_gather(full, shard, label="semantics reuse")
    else:
        handle = dist.all_gather_into_tensor(full, shard, async_op=True)
    handle.wait()
    torch.cuda._sleep(SLEEP_CYCLES)  # the device is busy past the free below
    ptr = full.data_ptr()
    del full, handle
    again = torch.empty(comm.world_size * shard.numel(), device="cuda")
    reused = again.data_ptr() == ptr
    torch.cuda.synchronize()
    return reused


def take_reports(sem: dict[str, Any], reports: list[Any]) -> None:
    """The agent's figures for the probes' collectives, by label."""
    for r in reports:
        for c in r.collectives:
            name = c.label.removeprefix("semantics ")
            if c.label.startswith("semantics ") and name in ("overlapped", "at once"):
                sem[name] = {
                    "duration_s": c.duration_s,
                    "exposed_s": c.exposed_s,
                    "clock": c.clock,
                    "exposed_measured": c.exposed_measured,
                }


def verdicts(sem: dict[str, Any], cuda: bool) -> list[Verdict]:
    """One verdict per semantic (NA on the CPU, where they are the host's)."""
    items = (
        "overlapped all-reduce: duration < 0.2 x the sleep, exposed < 1 ms",
        "all-reduce waited at once: exposed = duration (within 20%)",
        "collective duration on the device clock (torch's own events)",
        "freed gather buffer reused through the agent as bare (the agent holds nothing)",
    )
    if not cuda:
        return [
            verdict(item, None, "no GPU (tests/test_agent_device_timing.py: stubs)")
            for item in items
        ]
    sleep = sem.get("sleep_s") or 0.0
    over, once = sem.get("overlapped", {}), sem.get("at once", {})
    out = []
    if "duration_s" in over and over["clock"] == "device":
        ok = (
            over["duration_s"] < 0.2 * sleep
            and over["exposed_measured"]
            and over["exposed_s"] < 1e-3
        )
        out.append(verdict(items[0], ok, {**over, "sleep_s": sleep}))
    else:
        out.append(verdict(items[0], False, over or "no report"))
    if "duration_s" in once and once["clock"] == "device":
        d, e = once["duration_s"], once["exposed_s"]
        ok = once["exposed_measured"] and abs(e - d) <= 0.2 * d + 2e-5
        out.append(verdict(items[1], ok, once))
    else:
        out.append(verdict(items[1], False, once or "no report"))
    clocks = [r.get("clock") for r in (over, once)]
    out.append(verdict(items[2], clocks == ["device", "device"], clocks))
    reuse = sem.get("reuse", {})
    agent_reuse = reuse.get("agent")
    out.append(
        verdict(items[3], agent_reuse is not None and agent_reuse == reuse.get("bare"), reuse)
    )
    return out
