"""The heartbeat's host figures (agent/host_stats.py) against psutil, which reads the same
facts its own way, and against a known load (a busy loop, a sleep)."""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from zeroscope.agent import host_stats
from zeroscope.agent.host_stats import HostStats, mem_available
from zeroscope.agent.schema import HostSample

MIB = 1 << 20


def _sample(stats: HostStats) -> HostSample:
    s = HostSample()
    stats.fill(s)
    return s


@pytest.mark.skipif(sys.platform != "linux", reason="the /proc reader is Linux's")
def test_the_proc_reader_agrees_with_psutil() -> None:
    stats = HostStats()
    assert stats.native
    ballast = bytearray(64 * MIB)  # resident: written below
    ballast[::4096] = b"x" * len(ballast[::4096])
    s = _sample(stats)
    rss, available = psutil.Process().memory_info().rss, psutil.virtual_memory().available
    assert s.rss_bytes is not None and abs(s.rss_bytes - rss) < 4 * MIB
    assert s.rss_bytes > 64 * MIB
    assert s.mem_available_bytes is not None
    assert abs(s.mem_available_bytes - available) < max(available // 50, 64 * MIB)
    del ballast
    stats.close()


@pytest.mark.skipif(sys.platform != "linux", reason="the /proc reader is Linux's")
def test_cpu_percent_follows_the_load() -> None:
    """A busy thread, then a sleep: the share of a core the process used, against the process's
    own CPU clock over the same wall time (a loaded machine gives the busy loop less than a
    core, so no fixed threshold: the clock is the answer) and against psutil."""
    stats, proc = HostStats(), psutil.Process()
    wall0, cpu0 = time.monotonic(), time.process_time()
    proc.cpu_percent(None)
    while time.process_time() - cpu0 < 0.3:  # one busy thread: up to 100 % of a core
        pass
    busy, busy_psutil = _sample(stats).cpu_percent, proc.cpu_percent(None)
    expected = 100 * (time.process_time() - cpu0) / (time.monotonic() - wall0)
    time.sleep(0.4)
    idle = _sample(stats).cpu_percent
    assert busy is not None and idle is not None
    assert abs(busy - expected) < 15, (busy, expected)
    assert abs(busy - busy_psutil) < 15, (busy, busy_psutil)
    assert idle < 30 and idle < expected, (idle, expected)
    stats.close()


def test_without_proc_psutil_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise OSError("no /proc here")

    monkeypatch.setattr(host_stats.os, "open", refuse)
    stats = HostStats()
    assert not stats.native
    s = _sample(stats)
    assert s.rss_bytes is not None and abs(s.rss_bytes - psutil.Process().memory_info().rss) < (
        4 * MIB
    )
    assert s.mem_available_bytes is not None and s.cpu_percent is not None


def test_mem_available_is_read_in_bytes_or_not_at_all() -> None:
    text = b"MemTotal:       24641536 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n"
    assert mem_available(text) == 20000000 * 1024
    assert mem_available(b"MemTotal:       24641536 kB\nMemFree:         1000 kB\n") is None


def test_close_releases_the_files() -> None:
    stats = HostStats()
    fds = [fd for fd in (stats._statm, stats._meminfo) if fd >= 0]
    stats.close()
    assert not stats.native
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


@pytest.mark.skipif(sys.platform != "linux", reason="the /proc reader is Linux's")
def test_a_reader_whose_files_fail_turns_to_psutil(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = HostStats()
    assert stats.native

    def fail(*args: object) -> bytes:
        raise OSError("gone")

    monkeypatch.setattr(host_stats.os, "pread", fail)
    first = _sample(stats)  # this one's files failed: its memory figures stay NA
    assert first.rss_bytes is None and first.mem_available_bytes is None
    assert not stats.native
    second = _sample(stats)
    assert second.rss_bytes is not None and second.mem_available_bytes is not None
