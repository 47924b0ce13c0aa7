"""Which forwards have their activation bytes counted.

Counting costs a Python call per saved tensor (agent/activations.py: ~1 us each in a hot loop,
~8 us between a CPU step's kernels; a counted demo step costs ~2.8 % more), and activation
footprints repeat step to step for fixed shapes. So the agent counts steps 1-3 (the first
shapes, the first optimizer state) and then the N-th steps (``ZEROSCOPE_ACTIVATIONS_EVERY``,
default 10), at most :data:`MAX_COUNTED_FORWARDS` micro-batches of each, and by default not
more often than once a second, nor sooner than the agent's
cost on the last counted step allows within ``COUNT_BUDGET`` of the run's time (a counted step
of a deep model costs milliseconds: 3 ms waits 3 s): a 27 ms step is counted every 40th step,
a 1 s step every 10th, which keeps counting under ~0.1 % of the run either way (the agent's overhead budget, agent/cost.py). Steps in between carry the latest count, with ``activations_step`` saying which
step it is from. Setting the variable counts exactly every N-th step, with no time floor (1:
every step).

A count's cost is what the step lost, not only the agent's own counters: the hooks' timed part
is a fifth to a third of it (autograd calling into Python for every saved tensor and again to
unpack it, each handle's death, the caches the Python code evicts between the kernels: a
counted CPU step of the demo model is ~4.5 ms slower, its counters say ~0.7 ms). So the sender
thread also compares each counted step's host time from its first forward to its end with the
median of the last ``PLAIN_KEPT`` plain steps' (``observe``; one plain step is too noisy a
baseline: steps vary by milliseconds), and the larger of the two costs sets the wait, at most
``MAX_WAIT_S`` (a hiccup in a counted step must not stop counting for the rest of the run).
"""

from __future__ import annotations

import os
import time
from collections import deque

ACTIVATIONS_EVERY_ENV = "ZEROSCOPE_ACTIVATIONS_EVERY"
ACTIVATIONS_EVERY_DEFAULT = 10
MIN_INTERVAL_S = 1.0
"""With the default period: at least this long between two counted steps (after step 3)."""
COUNT_BUDGET = 0.001
"""With the default period: the share of the run's time the counting may take (the wait after
a count is at least its cost divided by this)."""
PLAIN_KEPT = 9
"""Plain steps whose host time makes the baseline a counted step is compared with."""
MAX_COUNTED_FORWARDS = 256
"""A counted step counts the saved tensors of its first this many forwards (micro-batches), and
its FLOPs (agent/work.py) over as many; the rest of the step takes the lean path. Real steps
stay under it (a GPipe schedule keeps every micro-batch's activations alive at once, so all of
them must be counted for the peak); a step whose end is never seen (a loop with no hooked
optimizer: a manual SGD update, an autograd probe) counted every forward while it lasted."""
MAX_WAIT_S = 60.0
"""The longest wait a count's cost can set (a slow counted step may have been slowed by
something else: a page-in, another process)."""


class ActivationCadence:
    """Decides, at each forward's start, whether its saved tensors are counted."""

    __slots__ = ("_last", "_plain_ns", "_wait_s", "clock", "every", "min_interval_s")

    def __init__(self, every: int = ACTIVATIONS_EVERY_DEFAULT, min_interval_s: float = 0.0) -> None:
        self.every = every
        self.min_interval_s = min_interval_s
        self._last = -float("inf")
        self._wait_s = min_interval_s
        """The time floor after the last count (``min_interval_s`` or more: ``spent``)."""
        self._plain_ns: deque[int] = deque(maxlen=PLAIN_KEPT)
        """The last plain steps' host times from their first forward to their end
        (``observe``)."""
        self.clock = time.monotonic
        """The time the floor is measured in (bench/agent_overhead.py counts only the steps run
        with the agent on, as a run with the agent always on would)."""

    @classmethod
    def from_env(cls, env: str = ACTIVATIONS_EVERY_ENV) -> ActivationCadence:
        """The period from the environment variable ``env`` (invalid or < 1 values mean the
        default, with the default's time floor; the attach's memory census reads its own)."""
        try:
            every = int(os.environ[env])
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
            now = self.clock()
            if now - self._last < self._wait_s:
                return False
            self._last = now
        return True

    def spent(self, seconds: float) -> None:
        """A counted step cost the agent ``seconds`` on the training thread: with the time
        floor (the default period) the next count waits at least ``seconds / COUNT_BUDGET``."""
        if self.min_interval_s:
            self._wait_s = max(self.min_interval_s, min(seconds / COUNT_BUDGET, MAX_WAIT_S))

    def observe(self, compute_ns: int | None, counted: bool) -> None:
        """(Sender thread, in step order.) A step's host time from its first forward to its
        end (None: no forward); a counted one's excess over the recent plain steps is what
        counting cost the run, and may lengthen the wait ``spent`` set from the counters (see
        the module docstring)."""
        plain = self._plain_ns
        if compute_ns is None:
            return
        if not counted:
            plain.append(compute_ns)
        elif plain and self.min_interval_s:
            excess = (compute_ns - sorted(plain)[len(plain) // 2]) / 1e9
            wait = min(excess / COUNT_BUDGET, MAX_WAIT_S)
            if wait > self._wait_s:
                self._wait_s = wait
