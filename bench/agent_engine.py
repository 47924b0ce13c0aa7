"""The engine cases of bench/agent_overhead.py: the bundled engine reporting to the agent.

- ``--model demo``: the demo model (examples/train_gpt.py's TinyGPT at the bench's demo shape,
  bench/sections.py ``DEMO``) at ZeRO stage 2: a small step, where a fixed cost per step
  weighs most.
- ``--model zero3``: a deep MLP (``--layers`` x ``--width``) at stage 3 with no persistent
  parameter and one layer per bucket: every step gathers each layer in forward and again in
  backward and reduce-scatters each layer's gradients, a few hundred collectives per step.

One engine serves both modes. It is built with a :class:`Switch` as its telemetry, and each
block of steps points the switch at the live agent or at the no-op. The switch copies the
target's bound methods onto itself, so a call through it is the target's call with no extra
frame: "off" costs what a job without the agent costs. The block hooks the engine installs for
the agent (activation split per block) exist only during the forwards the live agent counts,
as in a real run.
"""

from __future__ import annotations

from typing import Any

SEAM = (
    "hello",
    "bind_device",
    "layout",
    "pipeline",
    "phase",
    "block_enter",
    "block_exit",
    "blocks_wanted",
    "collective",
    "transfer",
    "model_inputs",
    "event",
    "step_end",
    "close",
)


class Switch:
    """A Telemetry that is the live agent or the no-op, switched between blocks of steps."""

    def __init__(self, target: Any) -> None:
        self.use(target)

    def use(self, target: Any) -> None:
        self.enabled = target.enabled
        for name in SEAM:
            setattr(self, name, getattr(target, name))


def _demo(args: Any, world: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import torch

    from bench.contenders import build_model
    from bench.sections import DEMO

    model = build_model(DEMO)
    gen = torch.Generator().manual_seed(world)
    idx = torch.randint(0, DEMO["vocab"], (DEMO["batch"], DEMO["block"]), generator=gen)
    return model, (idx, idx), {"stage": 2, "overlap_comm": True}


def _deep_mlp(args: Any, world: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(self.fc(x))

    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.Sequential(*(Layer(args.width) for _ in range(args.layers)))
            self.head = nn.Linear(args.width, 1)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.mse_loss(self.head(self.layers(x)), y)

    torch.manual_seed(0)
    model = Deep()
    layer = args.width * args.width + args.width
    zero = {
        "stage": 3,
        "reduce_bucket_size": layer,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": layer,
        "stage3_max_reuse_distance": 0,
    }
    gen = torch.Generator().manual_seed(world)
    x, y = torch.randn(args.batch, args.width, generator=gen), torch.randn(args.batch, 1)
    return model, (x, y), zero


def engine_step(args: Any, live: Any, world: int) -> Any:
    """Build the engine for ``args.model``; return ``step(tel)`` that runs one training step
    with ``tel`` (the live agent or a NullTelemetry) as the engine's telemetry."""
    from zeroscope.agent import api
    from zeroscope.engine.api import initialize

    model, inputs, zero = (_demo if args.model == "demo" else _deep_mlp)(args, world)
    switch = Switch(live)
    api.set_telemetry(switch)  # type: ignore[arg-type]
    config = {
        "train_micro_batch_size_per_gpu": inputs[0].shape[0],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": zero,
    }
    engine, *_ = initialize(model=model, config=config)
    off = api.NullTelemetry()

    def step(tel: Any) -> None:
        on = tel is live
        if switch.enabled != on:
            switch.use(live if on else off)
        loss = engine(*inputs)
        engine.backward(loss)
        engine.step()

    return step
