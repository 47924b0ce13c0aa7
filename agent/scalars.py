"""Loss and gradient-norm values read without forcing a device synchronization.

On CUDA, ``loss.item()`` in the training loop would block the host until the GPU has caught
up, destroying the overlap zeroscope measures. Instead the value is copied to pinned host memory
with ``non_blocking=True`` behind a CUDA event, and read once ``event.query()`` says the copy has
landed (normally by the next step's end). On CPU ``.item()`` costs nothing and is used at once.
"""

from __future__ import annotations

from typing import Any

import torch


class DeferredScalar:
    """A loss / grad-norm value: a float now, or a device tensor copied to pinned host memory
    without blocking, readable once its CUDA event has completed."""

    __slots__ = ("event", "host", "value")

    def __init__(self, value: Any) -> None:
        self.value: float | None = None
        self.host: torch.Tensor | None = None
        self.event: Any = None
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            if not value.is_cuda:  # the common CPU case in one call (.item() never syncs here)
                self.value = float(value.item() if value.numel() == 1 else value.reshape(-1)[0])
                return
            t = value.detach().reshape(-1)[0]
            if t.device.type == "cuda":
                self.host = torch.empty((), dtype=t.dtype, device="cpu", pin_memory=True)
                self.host.copy_(t, non_blocking=True)
                self.event = torch.cuda.Event()
                self.event.record()
            else:
                self.value = float(t.item())
        else:
            self.value = float(value)

    def ready(self, block: bool = False) -> bool:
        if self.event is None:
            return True
        if block:
            self.event.synchronize()  # only at close, when the loop is over
        if self.event.query():
            assert self.host is not None
            self.value = float(self.host.item())
            self.event = self.host = None
            return True
        return False


NO_SCALAR = DeferredScalar(None)
"""The value a step did not give (shared: a DeferredScalar of None never changes)."""
