"""CPU time of chosen threads of this process, by Linux thread id, at nanosecond resolution.

bench/agent_overhead.py charges the agent's own threads (its sender thread, ZeroMQ's I/O and
reaper threads) to the steps run with the agent on, whenever those threads happen to run: the
sender sends a batch of reports at most every 0.1 s (agent/outbox.py), often during a step run
with the agent off. ``/proc/<pid>/task/<tid>/stat`` counts in 10 ms ticks, too coarse for one
step; Linux's per-thread CPU clock (clock id ``(~tid << 3) | 6``, what ``pthread_getcpuclockid``
returns) reads any thread of the process, Python's or not.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_TASKS = Path("/proc/self/task")


def thread_ids() -> set[int]:
    """This process's thread ids now (empty where /proc is missing: not Linux)."""
    try:
        return {int(t) for t in os.listdir(_TASKS)}
    except OSError:
        return set()


class ThreadsCpu:
    """The summed CPU time of a fixed set of threads."""

    def __init__(self, tids: set[int]) -> None:
        self.names = sorted(_name(t) for t in tids)
        self._clocks = [((~t) << 3) | 6 for t in sorted(tids)]

    def ns(self) -> int:
        """Nanoseconds of CPU these threads have used so far (the agent's threads live as long
        as the run; one whose clock can no longer be read counts nothing)."""
        total = 0
        for clock in self._clocks:
            try:
                total += time.clock_gettime_ns(clock)
            except OSError:
                pass
        return total


def _name(tid: int) -> str:
    try:
        return (_TASKS / str(tid) / "comm").read_text().strip()
    except OSError:
        return str(tid)


AGENT_THREAD_PREFIXES = ("zeroscope-",)
"""Python threads the agent starts (its sender/sampler, its SIGTERM and peak-probe helpers)."""
NATIVE_AGENT_THREADS = ("ZMQbg/",)
"""Threads libzmq starts for the agent's socket (its I/O thread and reaper), by their OS name."""


def agent_thread_ids() -> set[int]:
    """The Linux thread ids of the agent's threads alive now: its Python threads by name and
    ZeroMQ's by their OS name (Python 3.11 does not give a Python thread's name to the OS)."""
    import threading

    tids = {
        t.native_id
        for t in threading.enumerate()
        if t.native_id is not None and t.name.startswith(AGENT_THREAD_PREFIXES)
    }
    return tids | {t for t in thread_ids() if _name(t).startswith(NATIVE_AGENT_THREADS)}
