"""An independent count of the bytes the engine allocates, for the memory tests.

The engine states its own P/G/O bytes (``strategy.memory()``); checking those against the ZeRO
formulas says nothing about buffers the accounting forgets (a device copy made and thrown away,
a second full model during init, a clone per rank at save). :class:`LiveBytes` watches every
tensor op through a ``TorchDispatchMode`` instead: each op's output whose storage is new (not
the storage of one of its inputs: views, in-place ops and ``out=`` write into existing memory)
is counted until that storage is freed (``weakref.finalize`` on the storage, which torch keeps
alive exactly as long as its memory). ``live`` and ``peak`` are bytes of storage allocated since
the mode was entered, so memory that existed before (the user's model) is not counted unless
:meth:`adopt` is told about it. Python-heap bytes (e.g. ``bytes`` blobs) are outside torch: tests pair this with
``tracemalloc`` where that matters.

It sees what runs on the calling thread (CPU backward runs there too); allocations inside a
collective backend's own threads are the backend's, not the engine's.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """Bytes of storage allocated inside the mode and still alive (``live``), and their
    high-water mark (``peak``, resettable with :meth:`reset_peak`)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._tracked: set[int] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {
            id(t.untyped_storage())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and t.device.type != "meta"
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t.untyped_storage(), inputs)
        return out

    def _track(self, storage: torch.UntypedStorage, inputs: set[int]) -> None:
        key = id(storage)
        nbytes = storage.nbytes()
        if key in inputs or key in self._tracked or nbytes == 0:
            return
        self._tracked.add(key)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._freed, key, nbytes)

    def _freed(self, key: int, nbytes: int) -> None:
        self._tracked.discard(key)
        self.live -= nbytes

    def adopt(self, tensors: Any) -> None:
        """Count these existing tensors' storages as live from now on (e.g. the user's model,
        so that a copy of it made beside it shows in the peak, and its release in ``live``)."""
        for t in tensors:
            self._track(t.untyped_storage(), set())
        self.peak = max(self.peak, self.live)

    def settled(self, quiet_s: float = 0.1, timeout_s: float = 2.0) -> int:
        """``live`` once no storage was freed for ``quiet_s`` (at most ``timeout_s``): a
        backend thread (gloo's worker) may drop its reference to a finished collective's
        tensors a moment after ``wait()`` returned, on a loaded machine."""
        deadline = time.monotonic() + timeout_s
        last, since = self.live, time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
            time.sleep(0.01)
            if self.live != last:
                last, since = self.live, time.monotonic()
        return self.live

    def reset_peak(self) -> int:
        """Start a new high-water mark from what is live now; returns that."""
        self.peak = self.live
        return self.live
