"""The agent's public API: the one narrow seam through which a training engine reports.

The bundled engine uses exactly this API, and so can any other engine. An engine gets its
reporter with :func:`telemetry` once, then calls it at a handful of places:

    tel = telemetry()
    tel.hello(config=ConfigSummary(...), params=ParamCounts(...))
    with tel.phase("forward"): ...
    work = tel.collective(dist.all_gather_into_tensor(out, inp, async_op=True),
                          op="all_gather", nbytes=out.numel() * out.element_size(), group_size=n)
    ...                       # compute that overlaps the collective
    work.wait()               # the wait is what the loop was exposed to
    tel.transfer("d2h", nbytes, start_ns, end_ns)
    tel.event("overflow", "grad overflow, step skipped", value=scale)
    tel.step_end(loss=loss, lr=lr, grad_norm=norm, loss_scale=scale, memory=MemoryBytes(...))

When zeroscope did not start the job (no ``ZEROSCOPE_COLLECTOR`` in the environment),
:func:`telemetry` returns :class:`NullTelemetry`, whose methods do nothing and whose
``collective`` hands back the very work object it was given: the cost is one method call.

Rules for implementations (they run inside the training loop): never block, never synchronize a
device for the sake of measurement, never raise into the caller.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal, Protocol

from .schema import (
    CollectiveOp,
    ConfigSummary,
    EventKind,
    MemoryBytes,
    ParallelLayout,
    ParamCounts,
    PipelineStep,
    TransferDirection,
)

PhaseName = Literal["data", "forward", "backward", "optimizer", "eval"]
"""A "forward" entered with autograd off (``torch.no_grad()``, ``inference_mode()``) is timed
as "eval": an evaluation's forward, not the step's training."""

COLLECTOR_ENV = "ZEROSCOPE_COLLECTOR"
"""Address the agent publishes to (e.g. ``tcp://127.0.0.1:5555``); set by ``zeroscope run``."""


class Waitable(Protocol):
    """What torch.distributed returns for ``async_op=True`` (a Work handle)."""

    def wait(self) -> Any: ...


class Telemetry:
    """The reporting seam. This base class is the no-op implementation; the live agent and the
    tests' recorders override what they need."""

    enabled: bool = False

    def hello(self, *, config: ConfigSummary, params: ParamCounts, device: str = "cpu") -> None:
        """Once, after the engine is built: topology, config summary and parameter counts."""

    def bind_device(self, device: str) -> None:
        """The rank's device, as early as it is known (before the engine's first collective,
        e.g. its init broadcasts), so those are timed on the device's clock too. ``hello``
        binds it as well for engines that never call this."""

    def layout(self, layout: ParallelLayout) -> None:
        """Once, after hello, in a tensor/pipeline-parallel job: this rank's mesh coordinates
        and pipeline schedule (carried in Hello)."""

    def pipeline(self, step: PipelineStep) -> None:
        """Before step_end, in a pipeline-parallel job: this step's timed stage actions."""

    @contextlib.contextmanager
    def phase(self, name: PhaseName) -> Iterator[None]:
        """Times one phase of the current step (may be entered many times per step: gradient
        accumulation runs forward/backward once per micro-batch; the times add up)."""
        yield

    def block_enter(self, input_bytes: int = 0) -> None:
        """One of the model's repeated blocks (transformer layers) starts its forward;
        ``input_bytes`` is its input tensor's size. Lets the agent split activation bytes by
        block (what activation checkpointing would save). Optional for an engine."""

    def block_exit(self) -> None:
        """The block whose forward :meth:`block_enter` announced has returned."""

    def blocks_wanted(self) -> bool:
        """Inside a forward phase: whether this forward wants :meth:`block_enter` /
        :meth:`block_exit` marks (the agent counts this step's activations: the first steps,
        then every Nth). An engine hooks its blocks only for such forwards, so a step that is
        not counted pays nothing for the marks (a module hook costs every call of its module)."""
        return False

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
        """Track one async collective from issue (now) to completion; returns a handle whose
        ``wait()`` must be used instead of ``work.wait()`` so the exposed time is measured.
        ``nbytes`` follows nccl-tests: full gathered size for all-gather / reduce-scatter."""
        return work

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
        """One completed offload transfer (``time.perf_counter_ns`` instants). A device copy
        passes ``end_event``, the completed CUDA event recorded right after it on its stream:
        the transfer is then placed on the step's device axis, ending there and lasting
        ``end_ns - start_ns`` (a host instant would be when the copy was queued, not when it
        ran; the live agent reads the event on its sender thread)."""

    def number_steps_from(self, first: int) -> None:
        """The job resumed from a checkpoint and its next step is ``first`` by its own count
        (call it before that step ends): the reports number the steps as the job does."""

    def model_inputs(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """One micro-batch is about to enter ``module``'s forward (call it at each forward):
        the live agent takes the step's tokens from it and counts model FLOPs on one step
        (agent/work.py)."""

    def event(self, kind: EventKind, message: str = "", value: float | None = None) -> None:
        """Something that happened now (overflow, scale change, checkpoint ...); the live agent
        sends it from its sender thread with the step reports (at most ~0.5 s later,
        agent/outbox.py), never behind a step report still waiting for its collectives."""

    def step_end(
        self,
        *,
        memory: MemoryBytes,
        loss: Any = None,
        lr: float | None = None,
        grad_norm: Any = None,
        loss_scale: float | None = None,
        overflow: bool = False,
        skipped: bool = False,
        samples: int = 0,
    ) -> None:
        """The optimizer step finished: emit one StepReport. ``loss`` and ``grad_norm`` may be
        tensors; implementations read them without forcing a device synchronization."""

    def close(self, exit_code: int = 0, message: str = "") -> None:
        """The rank is done (sends Bye)."""


class NullTelemetry(Telemetry):
    """Reports nothing: what an engine gets when zeroscope is not watching."""


_current: Telemetry | None = None
_claim_listeners: list[Callable[[], None]] = []


def on_claim(listener: Callable[[], None]) -> None:
    """Call ``listener`` (once) when code in this process first asks for :func:`telemetry`:
    that engine reports for itself, so the attach (agent/attach) stands down and nothing is
    counted twice."""
    _claim_listeners.append(listener)


def telemetry() -> Telemetry:
    """This process's reporter: the live agent when ``ZEROSCOPE_COLLECTOR`` is set, else a
    no-op. Created once per process."""
    global _current
    while _claim_listeners:
        _claim_listeners.pop()()
    if _current is None:
        if os.environ.get(COLLECTOR_ENV):
            from .startup import start_agent  # imported lazily: costs nothing when off

            _current = start_agent()
        else:
            _current = NullTelemetry()
    return _current


def set_telemetry(reporter: Telemetry | None) -> None:
    """Install a reporter explicitly (tests, other engines); ``None`` resets to auto."""
    global _current
    _current = reporter
