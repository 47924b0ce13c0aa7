"""Which forwards have their activation bytes counted.

Counting costs a Python call per saved tensor (agent/activations.py: ~1 us each in a hot loop,
~8 us between a CPU step's kernels; a counted demo step costs ~2.8 % more), and activation
footprints repeat step to step for fixed shapes. So the agent counts steps 1-3 (the first
shapes, the first optimizer state) and then the N-th steps (``ZEROSCOPE_ACTIVATIONS_EVERY``,
default 10), and by default not more often than once a second, nor sooner than the agent's
cost on the last counted step allows within ``COUNT_BUDGET`` of the run's time (a counted step
of a deep model costs milliseconds: 3 ms waits 3 s): a 27 ms step is counted every 40th step,
a 1 s step every 10th, which keeps counting under ~0.1 % of the run either way (issue 18). Steps in between carry the latest count, with ``activations_step`` saying which
step it is from. Setting the variable counts exactly every N-th step, with no time floor (1:
every step).
"""

from __future__ import annotations

import os
import time

ACTIVATIONS_EVERY_ENV = "ZEROSCOPE_ACTIVATIONS_EVERY"
ACTIVATIONS_EVERY_DEFAULT = 10
MIN_INTERVAL_S = 1.0
"""With the default period: at least this long between two counted steps (after step 3)."""
COUNT_BUDGET = 0.001
"""With the default period: the share of the run's time the counting may take (the wait after
a count is at least its cost divided by this)."""


class ActivationCadence:
    """Decides, at each forward's start, whether its saved tensors are counted."""

    __slots__ = ("_last", "_wait_s", "every", "min_interval_s")

    def __init__(self, every: int = ACTIVATIONS_EVERY_DEFAULT, min_interval_s: float = 0.0) -> None:
        self.every = every
        self.min_interval_s = min_interval_s
        self._last = -float("inf")
        self._wait_s = min_interval_s
        """The time floor after the last count (``min_interval_s`` or more: ``spent``)."""

    @classmethod
    def from_env(cls) -> ActivationCadence:
        """The period from the environment (invalid or < 1 values mean the default, with the
        default's time floor)."""
        try:
            every = int(os.environ[ACTIVATIONS_EVERY_ENV])
        except (KeyError, ValueError):
            every = 0
        if every < 1:
            return cls(ACTIVATIONS_EVERY_DEFAULT, MIN_INTERVAL_S)
        return cls(every)

    def may_count(self, step: int) -> bool:
        """Whether a forward of ``step`` can be counted at all (the step rule; ``due`` also
        applies the time floor): the agent's other steps take its lean path."""
        return step <= 3 or step % self.every == 0

    def due(self, step: int, counting: bool) -> bool:
        """Whether a forward of ``step`` is counted; ``counting``: an earlier forward of the
        same step was (gradient accumulation counts every micro-batch of a counted step)."""
        if step <= 3 or counting:
            return True
        if step % self.every:
            return False
        if self.min_interval_s:
            now = time.monotonic()
            if now - self._last < self._wait_s:
                return False
            self._last = now
        return True

    def spent(self, seconds: float) -> None:
        """A counted step cost the agent ``seconds`` on the training thread: with the time
        floor (the default period) the next count waits at least ``seconds / COUNT_BUDGET``."""
        if self.min_interval_s:
            self._wait_s = max(self.min_interval_s, seconds / COUNT_BUDGET)
