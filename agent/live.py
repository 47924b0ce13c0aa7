"""The live agent: the Telemetry a rank gets when ``ZEROSCOPE_COLLECTOR`` is set.

Per step it gathers what the engine tells it (P/G/O bytes, loss, lr, grad norm, loss scale,
overflow/skip), what it measures itself (phase spans and collective timing on the step's one
time axis — agent/timeline.py —, activation bytes through saved-tensor hooks, allocator figures
on CUDA without resetting them — agent/device_memory.py) and sends one StepReport per step, once
what the step issued has completed (agent/pending.py). Reports and events are encoded and sent
by the sampler thread, handed over without blocking (agent/outbox.py), which also sends
heartbeats with host/GPU figures.

Never block, never synchronize the device to measure, never raise into the training loop:
every entry point catches its own failures and counts them in ``errors``.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

import msgspec

from . import capture
from .activations import ActivationCounter, BlockSplit
from .api import PhaseName, Telemetry, Waitable
from .cadence import MAX_COUNTED_FORWARDS, ActivationCadence
from .comm import CollectiveTracker
from .cost import SeamCost, now_ns
from .device_memory import DevicePeaks
from .loss_scale import LossScaleReading
from .outbox import DRAIN_INTERVAL_S, Outbox
from .pending import RawTransfer, StepFacts, StepFigures
from .phase_scope import PhaseScope
from .publish import Publisher
from .rank_close import RankClose
from .rank_identity import RankIdentity
from .sampler import Sampler
from .scalars import NO_SCALAR, DeferredScalar
from .schema import (
    CollectiveOp,
    ConfigSummary,
    Event,
    EventKind,
    Heartbeat,
    HostSample,
    MemoryBytes,
    ParallelLayout,
    ParamCounts,
    PipelineStep,
    TransferDirection,
)
from .termination import TerminationBye
from .timeline import LOOP_BEGIN, LoopBegin, RawMark, StepAxis
from .work import WorkMeter


class LiveTelemetry(RankIdentity, RankClose, Telemetry):
    """Measures and publishes one rank's steps (see module docstring)."""

    enabled = True

    def __init__(
        self,
        publisher: Publisher,
        *,
        rank: int = 0,
        world_size: int = 1,
        local_rank: int = 0,
        node_rank: int = 0,
        job_id: str = "",
        engine: str = "zeroscope",
        sample_interval: float = 0.5,
        local_world_size: int = 0,
        spawned: bool = False,
    ) -> None:
        self.publisher = publisher
        self.rank, self.world_size = rank, world_size
        self.local_rank, self.node_rank = local_rank, node_rank
        self.local_world_size = local_world_size
        self.spawned = spawned
        self.job_id = job_id
        self.engine = engine
        self.errors = 0
        self.step = 1
        """The step in progress (the first StepReport is step 1)."""
        self._base = 0
        """The job's own number of the step before this run's first (a resumed run:
        :meth:`number_steps_from`); reports carry ``step + _base``."""
        self.cuda = False
        self.device_index: int | None = None
        """The GPU named in Hello: allocator figures are read for it, not the current device
        (an agent-API user may never call ``torch.cuda.set_device``)."""
        self.closed = False
        self._closing_thread: int | None = None
        self._close_done = threading.Event()
        self.termination: TerminationBye | None = None
        """Sends a Bye on SIGTERM once agent/startup.py ``install_exit_hooks`` ran."""
        self._hello_sent = False
        self._marks: list[RawMark] = []
        """The step's raw phase marks (agent/timeline.py: the sender makes the axis)."""
        self._device_event: Any = None
        """On CUDA: makes a timing event recorded now (each mark gets one); None on CPU."""
        self._started = False
        """Whether step 1 has begun (its first mark is the axis's origin)."""
        self._peaks: DevicePeaks | None = None
        self.cost = SeamCost()
        """The agent's own time on the training thread (agent/cost.py)."""
        self._activations = ActivationCounter()
        self._activations.cost = self.cost
        self._cadence = ActivationCadence.from_env()
        self.work = WorkMeter()
        """Tokens and model FLOPs per step, from the model's forward inputs (agent/work.py)."""
        self._plain = False
        """Whether this step's phases take the lean path (agent/phase_scope.py): on CPU, in a
        step whose activations cannot be counted."""
        self._counted_this_step = 0
        """Forwards of this step whose saved tensors were counted (at most
        :data:`~zeroscope.agent.cadence.MAX_COUNTED_FORWARDS`)."""
        self._counting = False
        """Inside a forward whose saved tensors are being counted (block marks count then)."""
        self._last_activations: tuple[int, int] | None = None  # (bytes, step measured)
        self._last_blocks: BlockSplit | None = None
        self._collectives = CollectiveTracker(cuda=False)
        self._collectives.cost = self.cost
        self._script: Any = None
        """The default group watched for the job's collectives beside the ones it reports
        (agent/script_collectives.py), from the first step end on."""
        self._script_checked = False
        self._bound_device: str | None = None
        self._transfers: list[RawTransfer] = []
        self._layout: ParallelLayout | None = None
        self._hello: tuple[ConfigSummary | None, ParamCounts | None, str] = (None, None, "cpu")
        self._pipeline: PipelineStep | None = None
        self._outbox = Outbox(publisher, lambda: self.step + self._base, rank, self._observe_step)
        self._host: HostSample | None = None
        self.sampler = Sampler(
            self._on_sample,
            interval=sample_interval,
            poll=publisher.poll_connection,
            drain=self._outbox.drain,
            drain_interval=DRAIN_INTERVAL_S,
            wake=self._outbox.wake,
        ).start()

    # -- the seam --------------------------------------------------------------------------

    def block_enter(self, input_bytes: int = 0) -> None:
        if self._counting:
            t0 = now_ns()
            try:
                self._activations.block_enter(input_bytes)
            except Exception:
                self.errors += 1
            self.cost.ns += now_ns() - t0

    def block_exit(self) -> None:
        if self._counting:
            t0 = now_ns()
            try:
                self._activations.block_exit()
            except Exception:
                self.errors += 1
            self.cost.ns += now_ns() - t0

    def blocks_wanted(self) -> bool:
        return self._counting

    def pipeline(self, step: PipelineStep) -> None:
        self._pipeline = step

    def phase(self, name: PhaseName) -> PhaseScope:  # type: ignore[override]
        if name == "forward":
            torch = sys.modules.get("torch")
            if torch is not None and not torch.is_grad_enabled():
                name = "eval"  # an evaluation's forward (agent/timeline.py)
        return PhaseScope(self, name)

    def _use_device_events(self, make: Any) -> None:
        """Mark each phase and step end with an event from ``make`` (CUDA), or not (None);
        never while the stream is capturing a CUDA graph (agent/capture.py)."""
        self._device_event = None if make is None else capture.watched(make, self._say_capture)
        self._collectives.cuda = make is not None
        self._fast_collective(self._started)
        self._plain = self._plain_step(self.step)

    def drop_marks(self, scope: PhaseScope) -> None:
        """Take back a phase's marks: it was entered and will never be left (the attach's
        :meth:`~zeroscope.agent.attach.session.AttachSession.drop_phase`)."""
        self._marks = [mark for mark in self._marks if mark[0] is not scope]

    def _say_capture(self) -> None:
        self.event("info", capture.SAID)

    def _plain_step(self, step: int) -> bool:
        """Whether ``step``'s phases take the lean path: on the host (no device events or
        peaks to take), and no forward of it can be counted (the cadence's step rule; its time
        floor is checked at the forward)."""
        return (
            self._device_event is None and self._peaks is None and not self._cadence.may_count(step)
        )

    def _mark(self, scope: PhaseScope | LoopBegin | None, host_ns: int | None = None) -> None:
        make = self._device_event
        self._marks.append(
            (scope, now_ns() if host_ns is None else host_ns, None if make is None else make())
        )

    def _phase_enter(self, scope: PhaseScope) -> None:
        """The full path of a phase's entry (a counted forward, a CUDA step)."""
        t0 = now_ns()
        try:
            counted = self._counted_this_step
            if (
                scope.name == "forward"
                and counted < MAX_COUNTED_FORWARDS
                and self._cadence.due(self.step, counted > 0)
            ):
                if not counted:  # the step's window starts at its first forward
                    self._activations.take_peak()
                counted = self._counted_this_step = counted + 1
                if counted == MAX_COUNTED_FORWARDS and self._device_event is None:
                    self._plain = self._peaks is None  # its later phases: the lean path
                hooks = scope.hooks = self._activations.hooks()
                hooks.__enter__()
                self._activations.take_blocks()  # each forward's own split (the last is kept)
                self._counting = True
            self._mark(scope)
            if self._peaks is not None:
                self._peaks.sample()
        except Exception:
            self.errors += 1
        self.cost.ns += now_ns() - t0

    def _phase_exit(self, scope: PhaseScope) -> None:
        t0 = now_ns()
        hooks, scope.hooks = scope.hooks, None
        if hooks is not None:
            self._counting = False
            with contextlib.suppress(Exception):
                hooks.__exit__(None, None, None)
        try:
            self._mark(scope)
            if self._peaks is not None:
                self._peaks.sample()
        except Exception:
            self.errors += 1
        self.cost.ns += now_ns() - t0

    def collective(
        self,
        work: Waitable,
        *,
        op: CollectiveOp,
        nbytes: int,
        group_size: int,
        prefetched: bool = False,
        label: str = "",
    ) -> Waitable:
        # On the host once step 1 has begun, ``self.collective`` is the tracker's recorder
        # itself (``_fast_collective``): this method runs for the first op, and on CUDA.
        t0 = now_ns()
        tracked = self._collectives.track(work, op, nbytes, group_size, prefetched, label, t0)
        if self._device_event is not None:  # the host recorder counts its own time
            self.cost.collective_ns += now_ns() - t0  # counted (cost.collectives) at step end
        if not self._started:
            self._begin(t0)
        return tracked

    def _fast_collective(self, on: bool) -> None:
        """Make ``self.collective`` the recorder's own call (agent/host_seam.py: in C where
        built, no Python frame per op) or this class's method again. Only on the host: a CUDA
        op takes the method's device path."""
        if on and self._device_event is None:
            self.__dict__["collective"] = self._collectives.recorder
        else:
            self.__dict__.pop("collective", None)

    def begin_first_step(self) -> None:
        """A frontend says a step begins now (an HF Trainer's ``on_step_begin``): step 1's time
        runs from here (agent/timeline.py ``LOOP_BEGIN``). Without it, a step 1 whose forward
        ran unseen (a model found at its first optimizer step) read its optimizer phase alone,
        or 0 s."""
        if not self._started:  # (set for good at step 1's end)
            self._begin(now_ns(), LOOP_BEGIN)

    def _begin(self, host_ns: int, scope: LoopBegin | None = None) -> None:
        """Step 1 has begun at ``host_ns`` with something other than a phase (``scope``: a
        frontend said so)."""
        self._started = True
        self._fast_collective(True)
        try:
            self._mark(scope, host_ns)
        except Exception:
            self.errors += 1

    def transfer(
        self,
        direction: TransferDirection,
        nbytes: int,
        start_ns: int,
        end_ns: int,
        label: str = "",
        *,
        end_event: Any = None,
    ) -> None:
        t0 = now_ns()
        self._transfers.append((direction, nbytes, start_ns, end_ns, label, end_event))
        if not self._started:
            self._begin(start_ns)
        self.cost.ns += now_ns() - t0

    @property
    def current_step(self) -> int:
        """The step under way, by the number its report will carry."""
        return self.step + self._base

    def number_steps_from(self, first: int) -> None:
        """The job resumed from a checkpoint: its next step is ``first`` by its own count
        (DeepSpeed's ``global_steps + 1`` after ``load_checkpoint``), and every report, event,
        heartbeat and Bye says the job's numbers from here. Only before the run's first step
        ends, so a run's steps never go back or skip; the agent's own schedule (the first
        steps counted, then every Nth) keeps counting this run's steps from 1."""
        if self.step == 1 and first >= 1:
            self._base = first - 1

    def model_inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        t0 = now_ns()
        self.work.inputs(module, args, kwargs, self.step)
        self.cost.ns += now_ns() - t0

    def event(self, kind: EventKind, message: str = "", value: float | None = None) -> None:
        t0 = now_ns()
        try:
            self._outbox.put(
                Event(
                    rank=self.rank,
                    step=self.step + self._base,
                    wall_ns=time.time_ns(),
                    event=kind,
                    message=message,
                    value=value,
                )
            )
        except Exception:
            self.errors += 1
        self.cost.ns += now_ns() - t0

    def step_end(
        self,
        *,
        memory: MemoryBytes,
        loss: Any = None,
        lr: float | None = None,
        grad_norm: Any = None,
        loss_scale: float | LossScaleReading | None = None,
        overflow: bool = False,
        skipped: bool = False,
        samples: int = 0,
    ) -> None:
        # Only what must be taken now is taken here, inline: the step's marks, collectives,
        # counted activations, device peaks and loss tensors. The step's axis and its
        # StepReport are made by the sender thread (agent/outbox.py, StepFacts.report): each
        # line run here runs cold between the engine's kernels, ~1 us apiece on a CPU step
        # (the agent's overhead budget, agent/cost.py).
        now = now_ns()
        try:
            if not self._hello_sent:
                self._send_hello(None, None, "cpu")
            counted = self._counted_this_step > 0
            if counted:
                self._counted_this_step = 0
                self._last_activations = (self._activations.take_peak(), self.step + self._base)
                self._last_blocks = self._activations.take_blocks()
            make = self._device_event
            end_event = None if make is None else make()
            if end_event is None and make is not None:  # inside a CUDA graph capture: the
                loss = grad_norm = None  # tensors hold nothing yet, and no copy may be enqueued
            marks, self._marks = self._marks, []
            transfers, self._transfers = self._transfers, []
            pipeline, self._pipeline = self._pipeline, None
            records = self._collectives.take_all()  # first: it adds the recorder's counters
            script = self._script
            if script is None and not self._script_checked:
                script = self._script = self._watch_script()
            if script is not None and (mark := script.mark(records)) is not None:
                records.append(mark)  # last: the pending report expands it (sender thread)
            cost = self.cost
            total = cost.ns + cost.collective_ns  # the step's share of the agent's time
            share, cost.reported_ns = total - cost.reported_ns, total
            if counted:  # what counting cost sets when the next count may come
                self._cadence.spent(share / 1e9)
            self._outbox.put(
                StepFacts(
                    rank=self.rank,
                    step=self.step + self._base,
                    wall_ns=time.time_ns(),
                    end_ns=now,
                    end_event=end_event,
                    marks=marks,
                    records=records,
                    # A copy: the caller may reuse its MemoryBytes; the sender fills it in.
                    memory=msgspec.structs.replace(memory),
                    loss=NO_SCALAR if loss is None else DeferredScalar(loss),
                    grad_norm=NO_SCALAR if grad_norm is None else DeferredScalar(grad_norm),
                    activations=self._last_activations,
                    blocks=self._last_blocks,
                    device=None if self._peaks is None else self._peaks.take(),
                    transfers=transfers,
                    pipeline=pipeline,
                    figures=StepFigures(
                        lr=lr,
                        loss_scale=loss_scale,
                        overflow=overflow,
                        skipped=skipped,
                        samples=samples,
                        host=self._host,
                    ),
                    overhead_ns=share,
                    work=self.work.take(self.step + self._base),
                ),
                now,
            )
            step = self.step = self.step + 1
            if not self._started:
                self._started = True
                self._fast_collective(True)
            self._plain = self._plain_step(step)
        except Exception:
            self.errors += 1
        cost = self.cost
        cost.ns += now_ns() - now
        cost.steps += 1

    def _watch_script(self) -> Any:
        """Once, at the first step end: the watch of the default group for collectives the
        job issues beside those it reports (None under the attach, whose wrappers see them,
        and where torch's Flight Recorder is off)."""
        self._script_checked = True
        if type(self._collectives) is not CollectiveTracker:  # the attach's own log
            return None
        from .script_collectives import ScriptWatch

        return ScriptWatch.create(self._layout)

    def _observe_step(self, facts: StepFacts, axis: StepAxis) -> None:
        """(Sender thread.) What a counted step really cost sets when the next count may come
        (agent/cadence.py ``observe``)."""
        counted = facts.activations is not None and facts.activations[1] == facts.step
        self._cadence.observe(axis.compute_ns, counted)

    def drain(self) -> None:
        """Send now, on this thread, every event and report that is ready (the sampler thread
        does this when woken or every ``DRAIN_INTERVAL_S``; tests call it to read what was sent
        at once)."""
        try:
            self._outbox.drain()
        except Exception:
            self.errors += 1

    def _on_sample(self, sample: HostSample) -> None:
        """(Sender thread, just before it drains.) The heartbeat joins the reports it sends
        next, in one ZeroMQ message."""
        self._host = sample
        self._outbox.add(
            # A heartbeat belongs to the last completed step (0 before the first), like Bye.
            Heartbeat(
                rank=self.rank, step=self.step - 1 + self._base, wall_ns=time.time_ns(), host=sample
            )
        )
