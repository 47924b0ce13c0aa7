"""The per-stage strategy protocol: what the engine asks of a ZeRO stage.

The engine (engine/engine.py) owns the loop, precision and reporting; a strategy owns where
P, G and O live and which collectives move them. Stages 0, 1 and 2 are
:class:`~.bucketed.BucketedStrategy` with different policies (zero/stages.py); stage 3 plugs in
by implementing the same protocol (zero/stage3*.py) and is picked by :func:`~.stages.make_strategy`.

One optimizer step, as the engine drives it::

    for each micro-batch:
        strategy.begin_micro_step(boundary=...)   # before loss.backward()
        loss.backward()                           # hooks may launch reductions (overlap_comm)
        strategy.end_micro_step()                 # launch what is left of this backward's work
    grads = strategy.reduced_grads()              # wait; this rank's averaged grad per shard,
                                                  # still multiplied by the loss scale
    ... engine: overflow check (fp16), global norm (strategy.sharded -> all-reduce), clip,
        unscale, adam_step(shard.master, grad_fp32, shard.state, hyper[shard.group]) ...
    strategy.publish_params()                     # masters -> 16-bit params (and all-gather)
    strategy.zero_grads()                         # also on a skipped (overflow) step

Reporting: a strategy issues collectives only through :class:`~..comm.Comm` (which reports
them) and states its bytes in :meth:`memory`; it never talks to the agent otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from zeroscope.agent.schema import MemoryBytes
from zeroscope.engine.optim import AdamState


@dataclass(kw_only=True, slots=True)
class Shard:
    """One flat range of parameters this rank updates: its fp32 master, Adam state, and the
    optimizer param group whose hyperparameters apply."""

    master: torch.Tensor
    """fp32, updated in place by adam_step (the parameter shard itself in fp32 training)."""
    state: AdamState
    group: int
    """Index into the optimizer's param_groups."""


class ZeroStrategy(Protocol):
    """See the module docstring for the call order."""

    stage: int
    sharded: bool
    """True when each rank holds only part of the gradients to step, so the global gradient
    norm and the overflow flag need an all-reduce."""

    @property
    def shards(self) -> list[Shard]: ...

    def begin_micro_step(self, *, boundary: bool) -> None:
        """Before backward; ``boundary`` = this backward completes the accumulation."""

    def end_micro_step(self) -> None:
        """After backward: launch any reduction this backward still owes."""

    def reduced_grads(self) -> list[torch.Tensor]:
        """At the boundary: wait for every reduction; one averaged gradient per shard (same
        numel as ``shard.master``), in the gradient dtype, still loss-scaled. The engine may
        modify them in place."""
        ...

    def publish_params(self) -> None:
        """After the masters moved: refresh the model's parameters from them."""

    def zero_grads(self) -> None:
        """Forget this step's gradients."""

    def memory(self) -> MemoryBytes:
        """Exact bytes of P, G and O this rank holds now."""
        ...

    def param_counts(self) -> tuple[int, int]:
        """(Psi: trainable elements, elements after padding)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state (masters, moments, step counts) for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
