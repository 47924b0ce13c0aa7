"""Pipeline stage balance: ``partition_method='profile'`` against DeepSpeed's default
``'parameters'`` on a model whose parameter counts say nothing about its time.

Twelve layers with the same parameters (one ``Linear(width, width)`` each) but different work:
the first four do three units of work per forward and per backward, the last eight one. Cut by
parameter count (6 + 6 layers), stage 0 gets three times the work of stage 1 (18 vs 6 units)
and stage 1 idles; cut by measured time (``profile``), 4 + 8 layers, 12 units each. Two stages,
four micro-batches, 1F1B, ZeRO-1, two gloo ranks. Each round runs every contender (order
rotating) in the same two processes; the comparison is the median of per-round ratios, and
``parameters`` appears twice so the A/A ratio shows the noise floor.

``--work sleep`` (default): a unit of work is a fixed sleep, so the stages' costs are what the
model says however loaded the machine is (a 2-core box shared by several jobs cannot time
matmuls reliably, and then neither can the profiler). ``--work matmul``: a unit is one more
application of the layer's weight (real compute; meaningful on an idle machine).

    python bench/pipeline_balance.py [--rounds 5] [--work sleep|matmul]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from bench.harness import median, paired_ratio, rotated
from zeroscope.state.pipeline import imbalance, mean_bubble

REPEATS = [3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1]
CONTENDERS = ["parameters", "profile", "parameters (A/A)"]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=2, help="measured train_batch calls per round")
    p.add_argument("--work", choices=["sleep", "matmul"], default="sleep")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--rows", type=int, default=8, help="rows per micro-batch")
    return p


UNIT_S = 0.02
"""One unit of ``sleep`` work (forward and backward each): long enough that the Python and
tensor overhead of a layer (a few ms on a loaded 2-core box) does not blur the 3:1 costs."""


class Wait(torch.autograd.Function):
    """Identity whose forward and backward each sleep ``seconds``: work of a known duration."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(ctx.seconds)
        return grad, None


class Repeated(nn.Module):
    """One Linear and ``repeats`` units of work: the same parameters for any amount of work."""

    def __init__(self, width: int, repeats: int, work: str = "sleep") -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.repeats, self.work = repeats, work

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.work == "sleep":
            return Wait.apply(torch.tanh(self.linear(x)), UNIT_S * self.repeats)
        for _ in range(self.repeats):
            x = torch.tanh(self.linear(x))
        return x


def _build(method: str, width: int, rows: int, work: str) -> Any:
    import zeroscope.engine.api as deepspeed
    from zeroscope.engine.parallel.pipe import LayerSpec, PipelineModule

    torch.manual_seed(0)
    net = PipelineModule(
        [LayerSpec(Repeated, width, r, work) for r in REPEATS],
        num_stages=2,
        loss_fn=nn.MSELoss(),
        partition_method=method,
        profile_input=torch.randn(rows, width),
    )
    config = {
        "train_micro_batch_size_per_gpu": rows,
        "gradient_accumulation_steps": 4,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 1},
    }
    engine, *_ = deepspeed.initialize(model=net, config=config)
    return engine, net.parts


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    engines = {
        name: _build(name.split()[0], args.width, args.rows, args.work) for name in CONTENDERS
    }
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(args.rows, args.width, generator=g),) * 2 for _ in range(4)]

    def stream() -> Any:
        while True:
            yield from data

    it = stream()
    for engine, _ in engines.values():
        engine.train_batch(it)  # warm-up: shape inference, P2P set-up
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in CONTENDERS}
    for round_index in range(args.rounds):
        for name in rotated(CONTENDERS, round_index):
            engine, _ = engines[name]
            step = compute = 0.0
            for _ in range(args.steps):
                dist.barrier()
                engine.train_batch(it)
                times = engine.probe.last
                step += times.step_s
                compute += times.compute_s
            figures[name].append((step / args.steps, compute / args.steps))  # this rank's
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, figures)
    if rank == 0:
        out.put({"ranks": gathered, "parts": {n: e[1] for n, e in engines.items()}})
    dist.destroy_process_group()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Figures per contender: median span, pipeline bubble, and ratios to ``parameters``."""
    import multiprocessing as mp

    from tests.distributed import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, 2, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    result = out.get(timeout=1800)
    for p in procs:
        p.join(timeout=60)
    ranks = result["ranks"]
    table: dict[str, Any] = {}
    for name in CONTENDERS:
        spans: list[float] = []
        bubbles: list[float] = []
        imbalances: list[float] = []
        for i in range(args.rounds):
            per_rank = [r[name][i] for r in ranks]
            span = max(step for step, _ in per_rank)
            computes = [c for _, c in per_rank]
            spans.append(span)
            # The Pipeline screen's and the advisor's definitions (zeroscope.state.pipeline).
            # A round whose span or compute was 0 measured nothing: left out, not counted as 0.
            bubble, ratio = mean_bubble(span, computes), imbalance(computes)
            if bubble is not None:
                bubbles.append(bubble)
            if ratio is not None:
                imbalances.append(ratio)
        table[name] = {
            "parts": result["parts"][name],
            "span": spans,
            "bubble": bubbles,
            "imbalance": median(imbalances),
        }
    base = table["parameters"]
    for row in table.values():
        row["span_ratio"] = paired_ratio(row["span"], base["span"])
        row["bubble_ratio"] = paired_ratio(row["bubble"], base["bubble"])
        row["span_s"], row["bubble_fraction"] = median(row["span"]), median(row["bubble"])
    return table


if __name__ == "__main__":
    print(json.dumps(run(parser().parse_args()), indent=2, default=str))
