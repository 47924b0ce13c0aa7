"""Loss and gradient-norm values read without forcing a device synchronization.

On CUDA, ``loss.item()`` in the training loop would block the host until the GPU has caught
up, destroying the overlap zeroscope measures. Instead the value is copied to pinned host memory
with ``non_blocking=True`` behind a CUDA event, and read once ``event.query()`` says the copy has
landed (normally by the next step's end). On CPU nothing waits either, but ``.item()`` still
costs the training thread a few microseconds of cold Python and C++ dispatch per value (issue
18): a CPU tensor outside autograd is kept and read by the sender thread instead, unless it was
changed in place meanwhile (its version counter moved): then the value is reported missing, never
wrong. A tensor that requires grad is read at once, so that holding it never keeps a graph alive.
"""

from __future__ import annotations

from typing import Any

import torch


class DeferredScalar:
    """A loss / grad-norm value: a float now, or a device tensor copied to pinned host memory
    without blocking, readable once its CUDA event has completed."""

    __slots__ = ("event", "host", "value", "version")

    def __init__(self, value: Any) -> None:
        self.value: float | None = None
        self.host: torch.Tensor | None = None
        self.event: Any = None
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            if not value.is_cuda:
                if value.requires_grad:  # read now: holding it would hold its graph
                    self.value = _first(value)
                else:  # the common CPU case: read on the sender thread (``ready``)
                    self.host, self.version = value, value._version
                return
            t = value.detach().reshape(-1)[0]
            if t.device.type == "cuda":
                self.host = torch.empty((), dtype=t.dtype, device="cpu", pin_memory=True)
                self.host.copy_(t, non_blocking=True)
                self.event = torch.cuda.Event()
                # On the stream the copy went on (the tensor's device's), which need not be
                # the current device's: else the value would be read before it lands.
                self.event.record(torch.cuda.current_stream(t.device))
            else:
                self.value = float(t.item())
        else:
            self.value = float(value)

    def ready(self, block: bool = False) -> bool:
        if self.event is None:
            host = self.host
            if host is not None:  # a CPU tensor kept as it was given
                self.host = None
                try:
                    self.value = _first(host) if host._version == self.version else None
                except Exception:  # unreadable (a meta tensor): missing, and the report goes
                    self.value = None
            return True
        if block:
            self.event.synchronize()  # only at close, when the loop is over
        if self.event.query():
            assert self.host is not None
            self.value = float(self.host.item())
            self.event = self.host = None
            return True
        return False


def _first(t: torch.Tensor) -> float:
    """A host tensor's value (its first element if it has more than one)."""
    try:
        return float(t.item())
    except RuntimeError:  # more than one element
        return float(t.reshape(-1)[0])


NO_SCALAR = DeferredScalar(None)
"""The value a step did not give (shared: a DeferredScalar of None never changes)."""
