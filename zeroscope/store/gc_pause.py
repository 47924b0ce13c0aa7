"""Python's cyclic garbage collector, held off where a viewer's allocations all survive.

Three uses, all in viewer processes only (never in the training job's: agent/ and engine/ leave
the user's collector alone):

- :func:`collector_paused`: a trace reader's batch of decoded messages. Each collection such a
  burst sets off would walk the whole heap for nothing (a 16,384-rank replay seek took 628-647
  ms of CPU with it running, 401-454 with the pause; docs/bench.md).
- :func:`catch_up_fold`: a viewer's catch-up (a late viewer's snapshot, a big backlog, a
  replay's seek rebuild) folded into ClusterState. The state grows by millions of long-lived
  objects, and the collector's whole-heap passes over them as it grows were ~1.7 s of a
  16,384-rank late viewer's 4.9 s fold. After a live viewer's snapshot the survivors are frozen
  (``gc.freeze``): later collections of the live view no longer walk them. Frozen objects are still freed by
  reference counting; only a frozen *cycle* that becomes garbage is never collected, and a
  folded ClusterState holds none (tests/test_gc_catch_up.py), so a replaced report or a seek's
  dropped state is freed as before.
- :func:`raise_viewer_thresholds`: the steady view's collections made rarer, once a process.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

CATCH_UP_MESSAGES = 8192
"""A batch of at least this many messages is a catch-up (a 4,096-rank job's snapshot is
12,288): smaller folds are quick, and their collections walk a small heap."""


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


def is_catch_up(messages: int) -> bool:
    """Whether a fold of ``messages`` messages gets :func:`catch_up_fold`."""
    return messages >= CATCH_UP_MESSAGES


@contextmanager
def catch_up_fold(active: bool = True, freeze: bool = True) -> Iterator[None]:
    """Fold a catch-up with the collector paused, then (``freeze``) freeze what survived.

    ``active`` False does nothing (the caller's small batches go through the same ``with``).
    Freeze only a live viewer's snapshot, once a connection: each freeze also takes the view's
    own objects then alive (Textual's), and those that later die in a cycle are never freed: a
    freeze after every step of a 64-rank live view grew its RSS from 99 to 274 MB over 1,200
    steps (bench/view_gc_long.py, docs/bench.md). A replay seek or a big live backlog, which
    recur, get the pause only. The freeze happens only when the fold completed (one cut short,
    a cancelled worker's, is left to the collector). Only the caller that found the collector
    running restarts it, as :func:`collector_paused`."""
    if not active:
        yield
        return
    running = gc.isenabled()
    gc.disable()
    done = False
    try:
        yield
        done = True
    finally:
        if done and freeze:
            gc.freeze()
        if running:
            gc.enable()


VIEWER_THRESHOLDS = (50_000, 20, 100)
"""The viewer process's collector thresholds (Python's defaults: 700, 10, 10 up to 3.13)."""


def raise_viewer_thresholds() -> None:
    """Make the viewer process's cyclic collections rarer: :data:`VIEWER_THRESHOLDS`.

    Called once where a viewer process starts (``zeroscope run`` hosting the collector and the
    view, ``attach``, ``replay``), never in agent/ or engine/: the training job's collector is
    the user's (its ranks are other interpreters, which start at Python's defaults). Nothing is
    restored at exit: the setting is the process's. It does not enable, disable or freeze.

    Why (docs/bench.md, "Raised thresholds: peak RSS measured"): the view's state and
    Textual's widgets are mostly long-lived, and with the defaults the steady view spends its
    time walking them. Measured 2026-12-02 on a shared 2-core box (Python 3.11), RSS sampled
    after every step with no collection forced: a 2,400-step TUI run (64 ranks, a frame each)
    spent 44.3 s of 216 s of CPU in collections (233 whole-heap) with the defaults and 5.9 s of
    178 s (none whole-heap) with these, peak RSS 108 MB against 103 (1,200 steps: 18.6 -> 2.8
    s, 107 MB against 101); 40 steps of 16,384 ranks' ingest spent 11.2 s of 41 s in
    collections (16 whole-heap) and 3.4 s of 34 s, peak RSS 1,315 MB against 1,314, a step's
    CPU max 1.4 s against 2.5. The young collections still free the cycles that die young; a
    whole-heap collection is postponed, not abolished (as long as before when it comes, ~1 s at
    16,384 ranks), and the cyclic garbage that reaches the old generation waits for it (the
    ~5 MB above).

    Python 3.12 and 3.13 keep this generational collector and these meanings. From 3.14 the
    collector is incremental: the first value is still the young threshold, the second sets
    how slowly the old generation is scanned (higher: slower), and the third is ignored; the
    setting stays a "collect less often" one there, but these numbers were measured on 3.11."""
    gc.set_threshold(*VIEWER_THRESHOLDS)
