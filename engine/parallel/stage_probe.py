"""Where a pipeline step's time goes on this rank: every forward, backward (full, or input- and
weight-gradient halves under zero-bubble schedules) of every micro-batch, and the time spent
waiting for point-to-point sends and receives.

Compute is timed by wrapping the stage's own per-micro-batch methods (``forward_one_chunk``,
``backward_one_chunk``, ``backward_weight_one_chunk``) on the instance: module backward hooks
would fire early on the first stage (its inputs need no gradient) and miss the weight-gradient
half. P2P waits are timed by wrapping torch.distributed.pipelining's ``_batch_p2p`` (each op is
handed to the agent as a ``p2p`` collective) and ``_wait_batch_p2p`` for the duration of one
schedule step only. The wrappers call through unchanged: numerics and order are untouched, and
nothing here synchronizes a device.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from zeroscope.agent.api import Telemetry

_KINDS = {"forward_one_chunk": "F", "backward_weight_one_chunk": "W"}


@dataclass(slots=True)
class Action:
    """One timed compute action (the schedule's F, B, I or W of one stage and micro-batch)."""

    kind: str
    stage: int
    microbatch: int
    start_ns: int
    end_ns: int


@dataclass(slots=True)
class StepTimes:
    """What one schedule step did on this rank."""

    start_ns: int = 0
    end_ns: int = 0
    actions: list[Action] = field(default_factory=list)
    p2p_wait_ns: int = 0

    @property
    def compute_s(self) -> float:
        return sum(a.end_ns - a.start_ns for a in self.actions) / 1e9

    @property
    def step_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


class StageProbe:
    """Times the stages of one rank; :meth:`step` brackets one schedule step."""

    def __init__(
        self,
        stages: list[Any],
        tel: Telemetry,
        phase: Callable[[Any], contextlib.AbstractContextManager[None]],
    ) -> None:
        self.tel = tel
        self.phase = phase
        """The engine's phase timer: forwards count as "forward", the rest as "backward"."""
        self.current: StepTimes | None = None
        self.last = StepTimes()
        for stage in stages:
            for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
                setattr(stage, name, self._timed(stage, name, getattr(stage, name)))

    def _timed(self, stage: Any, name: str, method: Any) -> Any:
        index = stage.stage_index
        phase = "forward" if name == "forward_one_chunk" else "backward"

        def run(chunk_id: int, *args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter_ns()
            try:
                with self.phase(phase):
                    return method(chunk_id, *args, **kwargs)
            finally:
                if self.current is not None:
                    if name == "backward_one_chunk":
                        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
                        kind = "B" if full else "I"
                    else:
                        kind = _KINDS[name]
                    self.current.actions.append(
                        Action(kind, index, int(chunk_id), t0, time.perf_counter_ns())
                    )

        return run

    @contextlib.contextmanager
    def step(self) -> Iterator[StepTimes]:
        """Time one ``schedule.step`` (P2P wrappers installed for its duration only)."""
        from torch.distributed.pipelining import schedules

        times = StepTimes(start_ns=time.perf_counter_ns())
        self.current = times
        batch, wait = schedules._batch_p2p, schedules._wait_batch_p2p
        schedules._batch_p2p = self._batch_p2p(batch)
        schedules._wait_batch_p2p = self._wait_p2p(wait, times)
        try:
            yield times
        finally:
            schedules._batch_p2p, schedules._wait_batch_p2p = batch, wait
            times.end_ns = time.perf_counter_ns()
            self.current = None
            self.last = times

    def _batch_p2p(self, original: Any) -> Any:
        tel = self.tel

        def batch(p2p_ops: list[Any], desc: str | None = None) -> list[Any]:
            works = original(p2p_ops, desc)
            if not tel.enabled or not works:
                return works
            sizes = [op.tensor.numel() * op.tensor.element_size() for op in p2p_ops]
            if len(works) != len(p2p_ops):  # coalesced: one handle for the batch
                sizes = [sum(sizes)] + [0] * (len(works) - 1)
            return [
                tel.collective(w, op="p2p", nbytes=n, group_size=2, label=desc or "p2p")
                for w, n in zip(works, sizes)
            ]

        return batch

    @staticmethod
    def _wait_p2p(original: Any, times: StepTimes) -> Any:
        def wait(work: list[Any]) -> None:
            t0 = time.perf_counter_ns()
            try:
                original(work)
            finally:
                times.p2p_wait_ns += time.perf_counter_ns() - t0

        return wait
