"""The object ``LiveTelemetry.phase`` returns.

A plain context manager with slots: a ``contextlib.contextmanager`` generator costs the training
thread about a microsecond more per phase entered (issue 18 budgets the agent's time per step).
The work itself is the agent's (``_phase_enter`` / ``_phase_exit``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import PhaseName
    from .live import LiveTelemetry


class PhaseScope:
    """What ``LiveTelemetry.phase`` returns: a plain context manager object (a generator-based
    one costs the training thread ~1 us more per phase)."""

    __slots__ = ("agent", "hooks", "name", "token")

    def __init__(self, agent: LiveTelemetry, name: PhaseName) -> None:
        self.agent = agent
        self.name = name
        self.hooks: Any = None
        self.token: int | None = None

    def __enter__(self) -> None:
        self.agent._phase_enter(self)

    def __exit__(self, *exc: object) -> None:
        self.agent._phase_exit(self)  # the loop's own exceptions pass through
