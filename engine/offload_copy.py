"""Host <-> device copies of the offload paths, and how each one is timed.

Two things a plain ``dst.copy_(src)`` gets wrong on a GPU:

- **A cast across the link.** ``device_bf16.copy_(host_fp32)`` first casts on the CPU into a
  *pageable* temporary, then copies from it synchronously: the pinned master is wasted. Here the
  cast goes into a page-locked 16-bit staging buffer on the host (on several cores:
  engine/host_cast.py), and only same-dtype bytes cross PCIe, with ``non_blocking=True``. Two
  staging buffers of at most :data:`STAGING_NUMEL` elements alternate, so the host casts chunk
  k+1 while the link carries chunk k; a buffer is reused only after its copy's end event.
- **What a transfer costs.** The cast is part of moving an fp32 master to a 16-bit parameter:
  a report of the link alone would show PCIe's GB/s while the step waits on the cast. A staged
  copy's report lasts the cast (host clock) plus the copy's own device time (its events): the
  transfer's own work, without the time it waited in the stream's queue. Every device copy is
  reported with its end event, so the agent places it on the step's device axis, ending where
  the copy ended (a staged copy's cast laid right before its copy), never at the host instant
  it was queued.
- **Timing the queue, not the copy.** Host time around a blocking copy includes every kernel
  queued before it (the end of backward). On CUDA each copy is timed with CUDA events recorded
  on the current stream right around it: the copy's own device time. Events are read only once
  complete; :meth:`Copier.poll` reports what has finished without waiting, :meth:`Copier.flush`
  waits for the last one (the optimizer step does, since it must hand the parameters to the next
  forward, and the host needs the gradients before CPU Adam anyway).

On the CPU the copies are synchronous and timed with ``perf_counter_ns`` around the copy alone
(there is no queued device work to include). The bytes reported are the bytes that cross the
link: the destination's dtype for host -> device (the 16-bit parameters, not the fp32 master).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from zeroscope.agent.api import Telemetry
from zeroscope.agent.schema import TransferDirection

from .host_cast import host_copy
from .host_memory import host_empty

STAGING_NUMEL = 1 << 24
"""Elements per host staging buffer (32 MiB in bf16); two of them alternate."""


@dataclass(slots=True)
class _Pending:
    direction: TransferDirection
    nbytes: int
    issued_ns: int
    start: Any
    end: Any
    label: str
    cast_ns: int = 0


class Copier:
    """Copies between host buffers and the engine's device, reporting each one."""

    def __init__(self, tel: Telemetry, *, pin: bool) -> None:
        self.tel = tel
        self.pin = pin
        self._staging: list[torch.Tensor | None] = [None, None]
        self._staging_done: list[Any] = [None, None]
        self._next = 0
        self._pending: list[_Pending] = []

    # -- copies ------------------------------------------------------------------------------

    def copy(
        self,
        direction: TransferDirection | None,
        dst: torch.Tensor,
        src: torch.Tensor,
        label: str = "offload",
    ) -> None:
        """``dst.copy_(src)``, reported as ``direction`` (None: not a transfer, not reported).
        A host -> device copy that changes dtype is cast on the host into staging first."""
        crossing = dst.device.type != "cpu" or direction is not None
        if src.dtype != dst.dtype and src.device.type == "cpu" and crossing:
            # (On a CPU-only engine "device" buffers are host tensors too: the same staged
            # path runs, so what is reported is what would cross PCIe on a GPU.)
            self._staged(direction, dst, src, label)
        else:
            self._timed(direction, dst, src, label)
        self.poll()

    def _staged(
        self, direction: TransferDirection | None, dst: torch.Tensor, src: torch.Tensor, label: str
    ) -> None:
        flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
        for lo in range(0, flat_src.numel(), STAGING_NUMEL):
            n = min(STAGING_NUMEL, flat_src.numel() - lo)
            stage = self._take_staging(n, dst.dtype)
            t0 = time.perf_counter_ns()
            # The cast, on the host (several cores), into page-locked memory.
            host_copy(stage, flat_src[lo : lo + n])
            self._timed(direction, flat_dst[lo : lo + n], stage, label, cast_from=t0)
            self._staging_done[self._next] = self._last_event

    def _take_staging(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        self._next = (self._next + 1) % 2
        done = self._staging_done[self._next]
        if done is not None:
            done.synchronize()  # its previous copy must have left the buffer
            self._staging_done[self._next] = None
        buf = self._staging[self._next]
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = host_empty(numel, dtype, pin=self.pin)  # numel <= STAGING_NUMEL
            self._staging[self._next] = buf
        return buf[:numel]

    def _timed(
        self,
        direction: TransferDirection | None,
        dst: torch.Tensor,
        src: torch.Tensor,
        label: str,
        cast_from: int | None = None,
    ) -> None:
        """The copy, reported from ``cast_from`` (the host instant its cast began) when given."""
        self._last_event = None
        nbytes = dst.numel() * dst.element_size()
        if dst.device.type == "cuda" or src.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            issued = time.perf_counter_ns()
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            self._last_event = end
            if direction is not None:
                began = issued if cast_from is None else cast_from
                self._pending.append(
                    _Pending(direction, nbytes, began, start, end, label, issued - began)
                )
            return
        t0 = time.perf_counter_ns() if cast_from is None else cast_from
        if src.device.type == "cpu" and dst.device.type == "cpu":
            host_copy(dst, src)
        else:
            dst.copy_(src)
        if direction is not None:
            self.tel.transfer(direction, nbytes, t0, time.perf_counter_ns(), label)

    _last_event: Any = None

    @property
    def last_event(self) -> Any:
        """The end event of the last copy issued on the device (None: it was synchronous)."""
        return self._last_event

    # -- reporting ---------------------------------------------------------------------------

    def poll(self) -> None:
        """Report the device copies that have completed (never waits)."""
        while self._pending and self._pending[0].end.query():
            self._report(self._pending.pop(0))

    def flush(self) -> None:
        """Wait for every device copy issued so far and report them all."""
        if self._pending:
            self._pending[-1].end.synchronize()
        while self._pending:
            self._report(self._pending.pop(0))

    def _report(self, p: _Pending) -> None:
        elapsed_ns = p.cast_ns + int(p.start.elapsed_time(p.end) * 1e6)
        end = p.issued_ns + elapsed_ns
        # The end event places the copy on the device axis (a host instant is when the copy
        # was queued); a staged copy's cast is laid right before it.
        self.tel.transfer(p.direction, p.nbytes, p.issued_ns, end, p.label, end_event=p.end)

    @property
    def staging_buffers(self) -> list[torch.Tensor]:
        """The host staging buffers (for memory accounting)."""
        return [b for b in self._staging if b is not None]
