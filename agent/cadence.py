"""Which forwards have their activation bytes counted.

Counting costs a Python call per saved tensor (agent/activations.py: ~1 us each in a hot loop,
~8 us between a CPU step's kernels; a counted demo step costs ~2.8 % more), and activation
footprints repeat step to step for fixed shapes. So the agent counts steps 1-3 (the first
shapes, the first optimizer state) and then the N-th steps (``ZEROSCOPE_ACTIVATIONS_EVERY``,
default 10), and by default not more often than once a second: a 27 ms step is counted every
40th step, a 1 s step every 10th, which keeps counting under ~0.1 % of the run either way
(issue 18). Steps in between carry the latest count, with ``activations_step`` saying which
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


class ActivationCadence:
    """Decides, at each forward's start, whether its saved tensors are counted."""

    __slots__ = ("_last", "every", "min_interval_s")

    def __init__(self, every: int = ACTIVATIONS_EVERY_DEFAULT, min_interval_s: float = 0.0) -> None:
        self.every = every
        self.min_interval_s = min_interval_s
        self._last = -float("inf")

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

    def due(self, step: int, counting: bool) -> bool:
        """Whether a forward of ``step`` is counted; ``counting``: an earlier forward of the
        same step was (gradient accumulation counts every micro-batch of a counted step)."""
        if step <= 3 or counting:
            return True
        if step % self.every:
            return False
        if self.min_interval_s:
            now = time.monotonic()
            if now - self._last < self.min_interval_s:
                return False
            self._last = now
        return True
