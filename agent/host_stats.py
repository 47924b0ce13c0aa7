"""The host figures a heartbeat carries: the process's CPU %, its resident set, the host's
available memory.

psutil reads them by opening, reading and parsing ``/proc`` files on every call (all of
``/proc/meminfo`` into a dict): ~100 us per sample in a hot loop and ~300 us on the agent's
sender thread, which wakes cold twice a second (the agent's overhead budget: ~0.06 % of a 2-rank CPU run). On Linux
this reader keeps the two files open and re-reads them with one ``pread`` each, takes the
process's CPU time from ``time.process_time()`` (the same user + system time psutil's
``cpu_percent`` divides by the wall time) and parses only the fields it needs. Elsewhere, or
where ``/proc`` cannot be opened, psutil answers as before.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .schema import HostSample

_MEM_AVAILABLE = b"MemAvailable:"


class HostStats:
    """Fills a HostSample's host figures; ``fill`` is called from one thread (the sampler)."""

    def __init__(self) -> None:
        self._statm = self._meminfo = -1
        self._psutil: Any = None
        self._proc: Any = None
        self._page = 4096
        try:
            self._statm = os.open("/proc/self/statm", os.O_RDONLY)
            self._meminfo = os.open("/proc/meminfo", os.O_RDONLY)
            self._page = os.sysconf("SC_PAGE_SIZE")
        except (OSError, AttributeError, ValueError):
            self.close()
            self._use_psutil()
        self._cpu_s = time.process_time()
        self._wall_s = time.monotonic()

    def _use_psutil(self) -> None:
        try:
            import psutil

            self._psutil, self._proc = psutil, psutil.Process()
            self._proc.cpu_percent(None)  # the first call primes its counter
        except Exception:
            self._psutil = self._proc = None

    @property
    def native(self) -> bool:
        """Whether the figures come from the kept ``/proc`` files (else psutil, or nothing)."""
        return self._statm >= 0

    def fill(self, s: HostSample) -> None:
        """Set ``s``'s CPU %, RSS and available memory (those that cannot be read stay None)."""
        if self._statm < 0:
            if self._proc is not None:
                s.cpu_percent = float(self._proc.cpu_percent(None))
                s.rss_bytes = int(self._proc.memory_info().rss)
                s.mem_available_bytes = int(self._psutil.virtual_memory().available)
            return
        cpu, wall = time.process_time(), time.monotonic()
        if wall > self._wall_s:
            s.cpu_percent = 100.0 * (cpu - self._cpu_s) / (wall - self._wall_s)
        self._cpu_s, self._wall_s = cpu, wall
        try:
            # statm: size resident shared text lib data dt, in pages.
            statm, meminfo = os.pread(self._statm, 256, 0), os.pread(self._meminfo, 8192, 0)
        except OSError:  # the files went away under us: psutil from the next sample on
            self.close()
            self._use_psutil()
            return
        s.rss_bytes = int(statm.split()[1]) * self._page
        s.mem_available_bytes = mem_available(meminfo)

    def close(self) -> None:
        for fd in (self._statm, self._meminfo):
            if fd >= 0:
                os.close(fd)
        self._statm = self._meminfo = -1


def mem_available(meminfo: bytes) -> int | None:
    """``MemAvailable`` of a ``/proc/meminfo`` text, in bytes (None: a kernel before 3.14,
    which does not say)."""
    at = meminfo.find(_MEM_AVAILABLE)
    if at < 0:
        return None
    return int(meminfo[at + len(_MEM_AVAILABLE) :].split(None, 2)[0]) * 1024
