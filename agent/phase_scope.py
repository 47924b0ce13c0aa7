"""The object ``LiveTelemetry.phase`` returns.

A plain context manager with slots (a ``contextlib.contextmanager`` generator costs ~1 us more
per phase). On the common path (CPU, a step whose activations are not counted) entry and exit
each append one raw mark to the agent's list and nothing else: every line run here runs cold
between the engine's kernels, ~10x its hot-loop cost (the agent's overhead budget, agent/cost.py). The sender thread makes the
phase spans from those marks (agent/timeline.py). A counted forward (saved-tensor hooks) and a
CUDA step (an event per mark, device peaks) take the agent's full path.
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import PhaseName
    from .live import LiveTelemetry


class PhaseScope:
    """What ``LiveTelemetry.phase`` returns (see the module docstring)."""

    __slots__ = ("agent", "hooks", "name")

    def __init__(self, agent: LiveTelemetry, name: PhaseName) -> None:
        self.agent = agent
        self.name = name
        self.hooks: Any = None

    def __enter__(self) -> None:
        agent = self.agent
        if agent._plain:
            t = perf_counter_ns()
            agent._marks.append((self, t, None))
            agent.cost.ns += perf_counter_ns() - t
        else:
            agent._phase_enter(self)

    def __exit__(self, *exc: object) -> None:  # the loop's own exceptions pass through
        agent = self.agent
        if self.hooks is None and agent._device_event is None and agent._peaks is None:
            t = perf_counter_ns()
            agent._marks.append((self, t, None))
            agent.cost.ns += perf_counter_ns() - t
        else:
            agent._phase_exit(self)
