"""What the agent costs the training thread, measured by the agent itself.

The agent's overhead budget is stated per step and per collective: ~30 us per step plus ~2 us per
collective on the training thread. To hold it, the agent times its own seam calls (phase entry
and exit, ``collective()``, the bookkeeping around ``wait()``, ``step_end``, transfers, block
marks, and the saved-tensor hooks of the steps whose activations are counted) with two
``perf_counter_ns`` reads each (~0.1 us) and adds them up here. The sum rides on
each StepReport (``agent_overhead_s``) and ``bench/agent_overhead.py`` divides it by the steps
and collectives it ran.

Only the training thread writes these counters (plain int additions, no lock; on CUDA the
saved tensors freed during backward are released on autograd's device thread, which adds
there too: a rare lost addition is accepted). The sender thread's work is deliberately not
counted: moving it off the training thread is the point.
"""

from __future__ import annotations

from time import perf_counter_ns

now_ns = perf_counter_ns


class SeamCost:
    """Running totals of the agent's own time on the training thread."""

    __slots__ = (
        "collective_ns",
        "collectives",
        "host_ended",
        "host_issued",
        "ns",
        "reported_ns",
        "steps",
    )

    def __init__(self) -> None:
        self.ns = 0
        """Nanoseconds spent inside the agent's seam calls other than per collective."""
        self.collective_ns = 0
        """Nanoseconds spent per collective: ``collective()`` and ``wait()``'s own
        bookkeeping (not the wait itself). Kept apart from ``ns`` so the per-collective path
        adds to one counter only."""
        self.collectives = 0
        """Collectives issued in the steps ended so far (counted at each step end)."""
        self.steps = 0
        self.reported_ns = 0
        """``total_ns`` when the last step's share was taken (``step_end``: the share rides on
        its StepReport)."""
        self.host_issued = 0
        """Host collective records taken by step ends so far (agent/comm.py)."""
        self.host_ended = 0
        """Host records whose end ``wait()`` or a step end stamped (resynced by a step end that
        looked at its records: ``CollectiveTracker.take_all``): when it equals
        ``host_issued`` every op was waited on and the step end need not look at each
        record."""

    @property
    def total_ns(self) -> int:
        """All the agent's time on the training thread."""
        return self.ns + self.collective_ns

    def per_step_us(self) -> float | None:
        """Microseconds per step outside the per-collective part (phases, step_end, ...)."""
        return self.ns / self.steps / 1e3 if self.steps else None

    def per_collective_us(self) -> float | None:
        return self.collective_ns / self.collectives / 1e3 if self.collectives else None
