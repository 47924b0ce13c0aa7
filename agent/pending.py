"""A step's report between its ``step_end`` and its sending.

A StepReport covers its own step: the phases and every collective issued in it, placed on the
step's axis (agent/timeline.py). Some of that is not known at ``step_end``: a collective still
in flight (issued near the end, or never waited for), CUDA events the device has not reached,
a loss tensor still being copied to the host. So the report waits in a queue and is sent, in
order, once everything it needs has completed — checked without blocking at every later step
end. A report waits at most ``MAX_DEFER_STEPS`` later steps; then it leaves with what has
completed, the collectives still in flight counted in ``collectives_unfinished`` (a CUDA
collective whose ``wait()`` is never called never completes as far as the agent can tell).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .comm import CollectiveRecord
from .scalars import DeferredScalar
from .schema import Collective, StepReport
from .timeline import StepAxis

MAX_DEFER_STEPS = 4
"""Later step ends a report may wait through for its collectives and device events."""


@dataclass(slots=True)
class PendingReport:
    report: StepReport
    """Everything known at step_end; timing, collectives, loss and grad norm filled at send."""
    loss: DeferredScalar
    grad_norm: DeferredScalar
    axis: StepAxis
    records: list[CollectiveRecord]
    age: int = 0
    """Step ends since this one."""
    _resolved: list[Collective | None] = field(default_factory=list)
    _failed: set[int] = field(default_factory=set)
    _device: bool = False

    def finish(self, block: bool = False) -> bool:
        """Fill the report if everything it waits for has completed (or it may wait no longer:
        ``block`` at close, or too old); False = keep waiting."""
        force = block or self.age > MAX_DEFER_STEPS
        scalars = self.loss.ready(block) and self.grad_norm.ready(block)
        device = self.axis.device
        if device and not self.axis.ready(block):
            if not force:
                return False
            device = False  # the device never reached its marks: fall back to the host axis
        collectives = self._collectives(device, block)
        if not force and (not scalars or None in collectives):
            return False
        r = self.report
        duration, phases, spans = self.axis.resolve(device)
        r.duration_s, r.phases, r.phase_spans = duration, phases, spans
        r.collectives = [c for c in collectives if c is not None]
        r.collectives_unfinished = len(self.records) - len(r.collectives)
        r.loss, r.grad_norm = self.loss.value, self.grad_norm.value
        return True

    def _collectives(self, device: bool, block: bool) -> list[Collective | None]:
        start = self.axis.start
        event: Any = start.event if device else None
        if len(self._resolved) != len(self.records) or device != self._device:
            self._resolved, self._device = [None] * len(self.records), device
        for i, rec in enumerate(self.records):
            if self._resolved[i] is not None or i in self._failed:
                continue
            try:
                if block and rec.cuda_events is not None and rec.cuda_events[2] is not None:
                    rec.cuda_events[2].synchronize()  # at close only: the loop is over
                self._resolved[i] = rec.resolve(start.host_ns, event)
            except Exception:  # an unreadable record is reported as unfinished, never raised
                self._failed.add(i)
        return [c for i, c in enumerate(self._resolved) if i not in self._failed]
