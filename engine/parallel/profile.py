"""``partition_method='profile'``: per-layer forward + backward time, measured on one rank.

Every layer is built (as DeepSpeed builds every LayerSpec to count parameters) and run on an
example micro-batch, each layer fed the previous layer's output, forward then backward of the sum
of its floating outputs; the median of a few repeats after one warm-up is the layer's weight.
Rank 0 measures and broadcasts the times, so every rank cuts the model at the same places (ranks
measuring for themselves would disagree by noise and build stages that do not fit together).
The broadcast's tensors live on the group's device (the rank's GPU under NCCL, which has no CPU
transport), and on a GPU each sample waits for the device before reading the clock, so a layer's
time is its kernels', not their launch (this runs once, at start-up, never in the loop).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def _leaf_inputs(x: Any) -> Any:
    """Detached copies; floating tensors require grad so backward reaches the layer's input."""
    items = tuple(
        t.detach().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
        for t in _as_tuple(x)
    )
    return items if isinstance(x, tuple) else items[0]


def _backward_of(out: Any) -> None:
    floats = [t for t in _as_tuple(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if floats:
        torch.autograd.backward([t.float().sum() for t in floats])


def _settle(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_layers(
    funcs: Sequence[Callable[[Any], Any]],
    example: Any,
    *,
    repeats: int = 3,
    device: torch.device | None = None,
) -> list[float]:
    """Seconds of forward + backward of each of ``funcs`` in turn, on ``example`` and then on
    each layer's output (on a GPU ``device``, waited for before each reading of the clock)."""
    where = torch.device("cpu") if device is None else device
    times = []
    x = example
    for fn in funcs:
        samples = []
        out: Any = None
        for i in range(repeats + 1):
            inp = _leaf_inputs(x)
            _settle(where)
            t0 = time.perf_counter()
            out = fn(inp)
            _backward_of(out)
            _settle(where)
            if i:  # the first run warms caches and allocators up
                samples.append(time.perf_counter() - t0)
        times.append(statistics.median(samples))
        for p in getattr(fn, "parameters", lambda: [])():
            p.grad = None  # the layer's real parameters: leave no gradient behind
        x = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in _as_tuple(out))
        x = x if isinstance(out, tuple) else x[0]
    return times


def profiled_weights(
    funcs: Callable[[], Sequence[Callable[[Any], Any]]],
    example: Any,
    *,
    repeats: int = 3,
    device: torch.device | None = None,
) -> list[float]:
    """Layer times measured on rank 0 and broadcast to every rank (``funcs`` builds the layers;
    only rank 0 calls it). ``device`` is the process group's (the rank's GPU under NCCL)."""
    where = torch.device("cpu") if device is None else device
    initialized = dist.is_available() and dist.is_initialized()
    if not initialized or dist.get_rank() == 0:
        built = funcs()
        example = example() if callable(example) else example
        times = time_layers(built, example, repeats=repeats, device=where)
        count = torch.tensor([len(times)], dtype=torch.int64, device=where)
    else:
        times, count = [], torch.zeros(1, dtype=torch.int64, device=where)
    if not initialized:
        return times
    dist.broadcast(count, src=0)
    n = len(times) if times else int(count.item())
    values = torch.tensor(times or [0.0] * n, dtype=torch.float64, device=where)
    dist.broadcast(values, src=0)
    if times:
        return times  # rank 0 sent these very numbers
    return [float(v) for v in values.cpu()]
