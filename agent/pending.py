"""A step's report between its ``step_end`` and its sending.

A StepReport covers its own step: the phases and every collective issued in it, placed on the
step's axis (agent/timeline.py). Some of that is not known at ``step_end``: a collective still
in flight (issued near the end, or never waited for), CUDA events the device has not reached,
a loss tensor still being copied to the host. So the report waits in a queue and is sent, in
order, once everything it needs has completed — checked without blocking by the agent's sender
thread (agent/outbox.py) each time it runs. A report waits at most ``MAX_DEFER_STEPS`` later steps; then it leaves with what has
completed, the collectives still in flight counted in ``collectives_unfinished`` (a CUDA
collective whose ``wait()`` is never called never completes as far as the agent can tell).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, NamedTuple

from . import capture
from .activations import BlockSplit
from .host_seam import resolve_host, resolve_hosts
from .loss_scale import LossScaleReading
from .scalars import DeferredScalar
from .schema import (
    Collective,
    MemoryBytes,
    PipelineStep,
    StepReport,
    Transfer,
    TransferDirection,
)
from .timeline import RawMark, StepAxis
from .work import work_report

_START = attrgetter("start_s")

RawTransfer = tuple[TransferDirection, int, int, int, str, Any]
"""(direction, nbytes, start_ns, end_ns, label, end_event) as ``transfer()`` was given them."""

MAX_DEFER_STEPS = 4
"""Later step ends a report may wait through for its collectives and device events."""


class StepFigures(NamedTuple):
    """The step's figures as ``step_end``'s caller gave them, unchecked (the sender thread reads
    them: agent/cost.py). Built by keyword."""

    lr: Any
    loss_scale: Any
    """A float, None, or a LossScaleReading read on the sender thread."""
    overflow: Any
    skipped: Any
    samples: Any
    host: Any
    """The agent's latest HostSample (or None)."""


class StepFacts:
    """What ``step_end`` took on the training thread, raw, in one constructor call: the sender
    thread makes the step's axis from its marks (agent/timeline.py) and turns the rest into the
    StepReport (``report``), so that building and converting run there, not between the
    engine's kernels (the agent's overhead budget, agent/cost.py). Built by keyword only: a
    field added or moved cannot shift its neighbours' values (tests/test_collective_record.py).
    """

    __slots__ = (
        "activations",
        "bad_transfers",
        "blocks",
        "device",
        "end_event",
        "end_ns",
        "figures",
        "grad_norm",
        "loss",
        "marks",
        "memory",
        "overhead_ns",
        "pipeline",
        "rank",
        "records",
        "step",
        "transfers",
        "wall_ns",
        "work",
    )

    def __init__(
        self,
        *,
        rank: int,
        step: int,
        wall_ns: int,
        end_ns: int,
        end_event: Any,
        marks: list[RawMark],
        records: list[Any],
        memory: MemoryBytes,
        loss: DeferredScalar,
        grad_norm: DeferredScalar,
        activations: tuple[int, int] | None,
        blocks: BlockSplit | None,
        device: tuple[int, int, int] | None,
        transfers: list[RawTransfer],
        pipeline: PipelineStep | None,
        figures: StepFigures,
        overhead_ns: int,
        work: tuple[Any, ...] | None = None,
    ) -> None:
        self.rank, self.step, self.wall_ns = rank, step, wall_ns
        self.end_ns, self.end_event = end_ns, end_event
        """The step's end (``perf_counter_ns``; its CUDA event on a device)."""
        self.marks = marks
        """The step's raw phase marks (agent/timeline.py)."""
        self.records = records
        """The collectives issued in the step (agent/comm.py), complete or not."""
        self.memory = memory
        """The step's figures, a copy this report may fill in."""
        self.loss, self.grad_norm = loss, grad_norm
        self.activations = activations
        """(bytes, step counted on) of the latest count; carried by steps with a forward."""
        self.blocks = blocks
        self.device = device
        """(allocated, reserved, peak) device bytes on CUDA."""
        self.transfers = transfers
        self.pipeline = pipeline
        self.figures = figures
        self.overhead_ns = overhead_ns
        self.bad_transfers = 0
        self.work = work
        """The step's tokens and FLOPs as agent/work.py took them (None: no forward seen)."""

    def _transfers(self, axis: StepAxis, device: bool) -> list[Transfer]:
        """The step's transfers on its axis; one the caller gave unreadable figures for is left
        out and counted in ``bad_transfers`` (it was not checked on the training thread). On
        the device axis a transfer with its copy's end event ends at that event: its start is
        never the host instant the copy was queued (the device may reach it much later)."""
        out = []
        start_ns = axis.start_ns
        for direction, nbytes, start, end, label, end_event in self.transfers:
            try:
                duration_s = max(end - start, 0) / 1e9
                if device and end_event is not None:
                    start_s = axis.offset_s((None, end, end_event), True) - duration_s
                else:
                    start_s = (start - start_ns) / 1e9
                out.append(
                    Transfer(
                        direction=direction,
                        nbytes=int(nbytes),
                        start_s=start_s,
                        duration_s=duration_s,
                        label=label,
                    )
                )
            except Exception:
                self.bad_transfers += 1
        return out

    def report(self, axis: StepAxis, device: bool = False) -> StepReport:
        """The StepReport, timing, collectives, loss and grad norm still to be filled."""
        mem = self.memory  # step_end's own copy
        if axis.forward_seen and self.activations is not None:
            mem.activations, mem.activations_step = self.activations
            blocks = self.blocks
            if blocks is not None and blocks.count:
                mem.activations_layers = blocks.count
                mem.activations_in_layers = blocks.inside
                mem.activations_layer_max = blocks.largest
                mem.activations_layer_inputs = blocks.inputs
        if self.device is not None:
            mem.device_allocated, mem.device_reserved, mem.device_peak = self.device
        figures = self.figures
        lr, loss_scale, overflow = figures.lr, figures.loss_scale, figures.overflow
        skipped, samples, host = figures.skipped, figures.samples, figures.host
        if isinstance(loss_scale, LossScaleReading):  # read here, on the sender thread
            overflow = skipped = loss_scale.overflow
            loss_scale = loss_scale.scale
        return StepReport(
            rank=self.rank,
            step=self.step,
            wall_ns=self.wall_ns,
            duration_s=0.0,
            memory=mem,
            transfers=self._transfers(axis, device),
            lr=None if lr is None else float(lr),
            loss_scale=None if loss_scale is None else float(loss_scale),
            overflow=bool(overflow),
            skipped=bool(skipped),
            samples=int(samples),
            host=host,
            pipeline=self.pipeline,
            agent_overhead_s=self.overhead_ns / 1e9,
            work=None if self.work is None else work_report(self.work),
        )


class PendingReport:
    """A step between its end and its sending (see the module docstring)."""

    __slots__ = (
        "_device",
        "_every",
        "_failed",
        "_mark",
        "_merged",
        "_resolved",
        "age",
        "axis",
        "facts",
        "grad_norm",
        "loss",
        "records",
        "report",
    )

    def __init__(self, facts: StepFacts, axis: StepAxis) -> None:
        self.facts = facts
        self.loss, self.grad_norm = facts.loss, facts.grad_norm
        self.axis = axis
        self.records = records = facts.records
        self._mark: Any = None
        """A step end's mark in a recorder (agent/attach/flight_recorder.py), expanded here,
        off the loop, once the reader says it is due: its read walks the whole ring."""
        if records and getattr(records[-1], "expand", None) is not None:
            self._mark = records[-1]
            self.records = records[:-1]
        self.age = 0
        """Step ends since this one."""
        self.report: StepReport | None = None
        """Built by ``finish`` (sender thread) once the step can be reported."""
        self._resolved: list[Collective | None] = []
        self._every: list[Collective] | None = None
        """The records resolved in one call when all had ended on the host (no None in it)."""
        self._failed: set[int] = set()
        self._device = False
        self._merged = False
        """The recorder's collectives were added to the wrappers' (sorted by issue at the end)."""

    def finish(self, block: bool = False, read: bool = False) -> bool:
        """Fill the report if everything it waits for has completed (or it may wait no longer:
        ``block`` at close, or too old); False = keep waiting. ``read``: the Flight Recorder is
        read now whatever its schedule (a hurried close: a host read, the device not waited
        for)."""
        if capture.state.underway and not block:
            return False  # no event may be touched while the training thread captures a graph
        if self._mark is not None:
            if not (block or read) and not self._mark.due():
                return False  # not counted against MAX_DEFER_STEPS: the reader bounds it
            mark, self._mark = self._mark, None
            try:
                taken = mark.expand()
                if taken:
                    self.records = self.records + taken
                    self._merged = True
            except Exception:
                pass
        force = block or self.age > MAX_DEFER_STEPS
        scalars = self.loss.ready(block) and self.grad_norm.ready(block)
        scale = self.facts.figures.loss_scale
        if isinstance(scale, LossScaleReading):
            scalars = scale.ready(block) and scalars
        device = self.axis.device
        if device and not self.axis.ready(block):
            if not force:
                return False
            device = False  # the device never reached its marks: fall back to the host axis
        collectives = self._collectives(device, block)
        # The common case, every op ended on the host and resolved in one call, needs no look
        # at each of a ZeRO-3 step's hundreds of records (the agent's overhead budget, agent/cost.py).
        every = self._every if collectives is self._every else None
        if not force and (not scalars or (every is None and None in collectives)):
            return False
        r = self.report = self.facts.report(self.axis, device)
        duration, phases, spans = self.axis.resolve(device)
        r.duration_s, r.phases, r.phase_spans = duration, phases, spans
        r.collectives = every if every is not None else [c for c in collectives if c is not None]
        if self._merged:  # the recorder's beside the wrappers': one list in issue order
            r.collectives = sorted(r.collectives, key=_START)
        r.collectives_unfinished = len(self.records) - len(r.collectives)
        r.loss, r.grad_norm = self.loss.value, self.grad_norm.value
        return True

    def _collectives(self, device: bool, block: bool) -> list[Collective | None]:
        start_ns = self.axis.start_ns
        if not self._resolved:  # first look: every op ended and on the host (the common case)
            every = resolve_hosts(self.records, start_ns)
            if every is not None:
                self._resolved = self._every = every  # type: ignore[assignment]
                return every  # type: ignore[return-value]
        event: Any = self.axis.start_event if device else None
        if len(self._resolved) != len(self.records) or device != self._device:
            self._resolved, self._device = [None] * len(self.records), device
        for i, rec in enumerate(self.records):
            if self._resolved[i] is not None or i in self._failed:
                continue
            try:
                if type(rec) is list:  # a host record (agent/comm.py)
                    self._resolved[i] = resolve_host(rec, start_ns)
                    continue
                if block and rec.cuda_events is not None and rec.cuda_events[2] is not None:
                    rec.cuda_events[2].synchronize()  # at close only: the loop is over
                self._resolved[i] = rec.resolve(start_ns, event)
            except Exception:  # an unreadable record is reported as unfinished, never raised
                self._failed.add(i)
        return [c for i, c in enumerate(self._resolved) if i not in self._failed]
