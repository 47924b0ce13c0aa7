"""Python's cyclic garbage collector paused around a burst of allocations that all survive (a
trace reader's batch of decoded messages): each collection such a burst sets off would walk the
whole heap for nothing (a 16,384-rank replay seek took 628-647 ms of CPU with it running, 401-454
with the pause; docs/bench.md)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a burst of allocations that all survive
    (msgspec's advice for large decodes). Only the caller that found it running restarts it,
    so two threads pausing at once leave it running."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()
