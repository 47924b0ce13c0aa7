"""The activation counter's saved-tensor hooks entered around a compiled function (as the
attach's compiled-model wrapper enters them): Dynamo compiles the same frames with the same
graph breaks as without them, counting on some calls recompiles nothing, and A is what the
compiled graph saves for backward. Oracle: Dynamo's own counters for the same function run
without the hooks, and the storages a plain saved-tensor hook pair receives from the same
compiled call. (The hooks' own frames inside a graph break's eager code are kept out of Dynamo
too: that needs DDP's breaks, and tests/test_compiled_jobs.py checks it.)"""

from __future__ import annotations

import torch

from zeroscope.agent.activations import ActivationCounter


def _fn(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ w).sin().sum()


def _counts() -> tuple[int, dict[str, int]]:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), dict(counters["frames"])


def _run(hooks: object | None) -> tuple[tuple[int, dict[str, int]], int]:
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(_fn, backend="aot_eager")
    x, w = torch.randn(8, 16), torch.randn(16, 4, requires_grad=True)
    peak = 0
    for call in range(3):
        if hooks is None or call == 0:  # the first call compiles uncounted, the next counted
            compiled(x, w).backward()
            continue
        counter = ActivationCounter()
        with counter.hooks():
            loss = compiled(x, w)
        peak = counter.take_peak()
        loss.backward()
    return _counts(), peak


def test_counting_hooks_add_no_graph_break_no_frame_and_count_what_the_graph_saves() -> None:
    plain, _ = _run(None)
    counted, peak = _run(object())
    assert counted == plain
    assert plain[1].get("ok", 0) >= 1  # the function really compiled
    # What the compiled graph saved, seen by a plain hook pair around the same call.
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:  # no nn.Parameter here: every storage counts
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    compiled = torch.compile(_fn, backend="aot_eager")
    x, w = torch.randn(8, 16), torch.randn(16, 4, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        compiled(x, w)
    assert peak == sum(seen.values()) > 0
