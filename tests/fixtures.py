"""A synthetic but plausible multi-rank ZeRO run made of real wire-schema messages.

Deterministic for a given seed (no clocks): snapshot tests, state tests and benches all read
the same run. Shape: stage 3 with CPU optimizer offload and fp16 dynamic loss scaling on
``ranks`` ranks; P/G/O bytes follow zeroscope.state.formulas so the Memory screen's "predicted" and
"measured" agree; one rank turns into a straggler (computes 45 % longer; the others wait for it
in their collectives, so every rank's step time is the same); the loss scale overflows at start-up (as
fp16 runs do) and once more later; one rank's publisher drops a few messages.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Collective,
    ConfigSummary,
    Event,
    Hello,
    HostSample,
    MemoryBytes,
    Message,
    ParamCounts,
    Phases,
    StepReport,
    Transfer,
    Work,
)
from zeroscope.state.formulas import model_state_bytes

BASE_NS = 1_750_000_000_000_000_000
"""Fixed wall clock origin (no time.time() in fixtures: snapshots must be reproducible)."""


@dataclass(kw_only=True, slots=True)
class RunShape:
    ranks: int = 4
    steps: int = 40
    seed: int = 0
    psi: int = 12_000_000
    layers: int = 6
    stage: int = 3
    precision: str = "fp16"
    offload_optimizer: str = "cpu"
    straggler: int | None = -1
    """Rank that slows down from step ``straggle_from`` on (-1 = the last rank)."""
    straggle_from: int = 20
    overflow_steps: tuple[int, ...] = (0, 1, 2, 3, 30)
    drops_at: int = 12
    device: str = "cpu"
    job_id: str = "demo-0001"
    collectives: bool = True
    work: bool = False
    """Each report carries the model's work (tokens, counted FLOPs, the device's peak), as the
    agent's reports of a model it saw run forward do (a step's close then works out the
    cluster's tokens/s and MFU over every rank's)."""


def _scale_after(scale: float, hysteresis: int, overflow: bool) -> tuple[float, int, bool]:
    """DeepSpeed's DynamicLossScaler on overflow (hysteresis 2, window long): returns the new
    scale, hysteresis left, and whether the scale changed."""
    if not overflow:
        return scale, hysteresis, False
    if hysteresis > 1:
        return scale, hysteresis - 1, False
    return max(scale / 2, 1.0), 1, True


def _work(s: RunShape) -> Work:
    """One rank's work in a step: 4 sequences of 1,024 tokens through a model of ``psi``
    parameters (6 FLOPs a parameter a token), on a device of 312 TFLOP/s."""
    tokens = 4 * 1024
    return Work(
        tokens=tokens,
        positions=tokens,
        seq_len=1024,
        flops=6.0 * s.psi * tokens,
        flops_step=1,
        peak_flops=312e12,
        peak_source="datasheet",
        dense_params=s.psi,
        layers=s.layers,
        hidden=1024,
    )


def synthetic_run(shape: RunShape | None = None) -> list[Message]:
    """Hellos, then per step one StepReport per rank (plus Events), in arrival order."""
    s = shape or RunShape()
    rng = random.Random(s.seed)
    straggler = (
        (s.ranks - 1 if s.straggler == -1 else s.straggler) if s.straggler is not None else None
    )
    config = ConfigSummary(
        stage=s.stage,
        precision=s.precision,  # type: ignore[arg-type]
        dp_world_size=s.ranks,
        offload_optimizer=s.offload_optimizer,  # type: ignore[arg-type]
        overlap_comm=True,
        max_reuse_distance=0,  # forward's gathers are not kept: backward gathers again
        micro_batch_size=4,
        train_batch_size=4 * s.ranks,
    )
    params = ParamCounts(total=s.psi, trainable=s.psi, largest_layer=s.psi // s.layers)
    out: list[Message] = [
        Hello(
            schema_version=SCHEMA_VERSION,
            job_id=s.job_id,
            rank=r,
            world_size=s.ranks,
            local_rank=r % 8,
            node_rank=r // 8,
            hostname=f"node{r // 8}",
            pid=1000 + r,
            device=s.device,
            started_ns=BASE_NS,
            config=config,
            params=params,
        )
        for r in range(s.ranks)
    ]
    predicted = model_state_bytes(s.psi, s.ranks, s.stage, s.precision, s.offload_optimizer)
    wall = [BASE_NS + 2_000_000_000 + r * 1000 for r in range(s.ranks)]
    scale, hyst = 65536.0, 2
    layer_bytes = 2 * s.psi // s.layers
    for step in range(s.steps):
        overflow = step in s.overflow_steps
        new_scale, hyst, changed = _scale_after(scale, hyst, overflow)
        loss = 1.4 + 2.8 * math.exp(-step / 15) + rng.uniform(-0.03, 0.03)
        reports: list[StepReport] = []
        for r in range(s.ranks):
            slow = 1.45 if (r == straggler and step >= s.straggle_from) else 1.0
            fwd = 0.040 * slow * rng.uniform(0.97, 1.03)
            bwd = 0.080 * slow * rng.uniform(0.97, 1.03)
            opt = 0.025 * rng.uniform(0.95, 1.05)
            data = 0.002
            duration = data + fwd + bwd + opt
            colls: list[Collective] = []
            if s.collectives:
                t = data
                for i in range(s.layers):  # forward gathers, mostly prefetched
                    d = layer_bytes / 6e9 * rng.uniform(0.9, 1.1)
                    colls.append(
                        Collective(
                            "all_gather", layer_bytes, s.ranks, t, d, d * 0.25, i > 0, f"fwd.L{i}"
                        )
                    )
                    t += fwd / s.layers
                for i in reversed(range(s.layers)):  # backward gathers + gradient reduce-scatter
                    d = layer_bytes / 6e9 * rng.uniform(0.9, 1.1)
                    colls.append(
                        Collective(
                            "all_gather", layer_bytes, s.ranks, t, d, d * 0.2, True, f"bwd.L{i}"
                        )
                    )
                    d2 = layer_bytes / 5e9 * rng.uniform(0.9, 1.1)
                    colls.append(
                        Collective(
                            "reduce_scatter",
                            layer_bytes,
                            s.ranks,
                            t + d,
                            d2,
                            d2 * 0.4,
                            False,
                            f"grad.L{i}",
                        )
                    )
                    t += bwd / s.layers
            transfers: list[Transfer] = []
            if s.offload_optimizer != "none":
                shard = int(predicted.host_grads)
                t0 = data + fwd + bwd
                transfers = [
                    Transfer("d2h", shard, t0, shard / 8e9 * rng.uniform(0.9, 1.1), "grads"),
                    Transfer(
                        "h2d", shard, t0 + opt * 0.8, shard / 9e9 * rng.uniform(0.9, 1.1), "params"
                    ),
                ]
            memory = MemoryBytes(
                params=int(predicted.params),
                grads=int(predicted.grads),
                optim=int(predicted.optim),
                activations=int(3.1e7 * rng.uniform(0.98, 1.02)),
                gathered_params=layer_bytes * 2,
                host_grads=int(predicted.host_grads),
                host_optim=int(predicted.host_optim),
            )
            host = HostSample(
                cpu_percent=round(rng.uniform(80, 100), 1),
                rss_bytes=int(1.1e9 + r * 1e6),
                mem_available_bytes=int(20e9),
            )
            reports.append(
                StepReport(
                    rank=r,
                    step=step,
                    wall_ns=wall[r],
                    duration_s=duration,
                    phases=Phases(data=data, forward=fwd, backward=bwd, optimizer=opt),
                    memory=memory,
                    collectives=colls,
                    transfers=transfers,
                    loss=None if overflow else loss + 0.01 * r,
                    lr=1e-3 * min(1.0, (step + 1) / 10),
                    grad_norm=None if overflow else 1.0 + 0.5 * math.exp(-step / 10),
                    loss_scale=scale,
                    overflow=overflow,
                    skipped=overflow,
                    samples=4,
                    host=host,
                    dropped=3 if (r == 1 and step == s.drops_at) else 0,
                    work=_work(s) if s.work else None,
                )
            )
        out += _synchronize(reports, wall)
        if overflow:
            out.append(
                Event(
                    rank=0,
                    step=step,
                    wall_ns=wall[0],
                    event="overflow",
                    message=f"gradient overflow, step {step} skipped",
                    value=scale,
                )
            )
        if changed:
            out.append(
                Event(
                    rank=0,
                    step=step,
                    wall_ns=wall[0],
                    event="scale_change",
                    message=f"loss scale {scale:g} -> {new_scale:g}",
                    value=new_scale,
                )
            )
        scale = new_scale
    return out


def _synchronize(reports: list[StepReport], wall: list[int]) -> list[StepReport]:
    """Synchronous collectives: every rank ends the step with the slowest; the others spend
    the difference waiting inside their last collective (exposed), as real ranks do."""
    end = max(r.duration_s for r in reports)
    for r in reports:
        lag = end - r.duration_s
        if r.collectives and lag > 0:
            last = r.collectives[-1]
            last.duration_s += lag
            last.exposed_s += lag
        r.duration_s = end
        wall[r.rank] += int(end * 1e9)
        r.wall_ns = wall[r.rank]
    return reports


class MemoryTrace:
    """The read side of a trace (steps / hellos / messages by step range) over a message list,
    for replay tests that need no SQLite file."""

    def __init__(self, messages: list[Message]) -> None:
        self._hellos = [m for m in messages if isinstance(m, Hello)]
        self._stepped = sorted(
            (m for m in messages if not isinstance(m, Hello)), key=lambda m: m.step
        )

    def steps(self) -> tuple[int, int] | None:
        if not self._stepped:
            return None
        return self._stepped[0].step, self._stepped[-1].step

    def hellos(self) -> list[Hello]:
        return sorted(self._hellos, key=lambda h: h.rank)

    def messages(self, from_step: int | None = None, to_step: int | None = None) -> list[Message]:
        lo = -(10**18) if from_step is None else from_step
        hi = 10**18 if to_step is None else to_step
        return [m for m in self._stepped if lo <= m.step <= hi]  # type: ignore[union-attr]


def write_trace(path: object, messages: list[Message]) -> None:
    """Record ``messages`` as a real SQLite trace, the way the collector does."""
    from zeroscope.agent import schema
    from zeroscope.store.trace import TraceWriter

    writer = TraceWriter(
        str(path), job_id=next((m.job_id for m in messages if isinstance(m, Hello)), "")
    )
    for m in messages:
        writer.append(m, schema.encode(m))
    writer.close()


def split_by_step(run: list[Message]) -> tuple[list[Message], dict[int, list[Message]]]:
    """A run's Hellos, and its other messages grouped by step in arrival order: how a viewer
    takes a run one step at a time (the benches' ingest and frame loops)."""
    hellos = [m for m in run if isinstance(m, Hello)]
    steps: dict[int, list[Message]] = {}
    for m in run:
        if not isinstance(m, Hello):
            steps.setdefault(m.step, []).append(m)
    return hellos, steps
