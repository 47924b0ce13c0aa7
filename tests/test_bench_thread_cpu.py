"""bench/thread_cpu.py: the agent-overhead bench charges the agent's threads by their own CPU
clocks, read from another thread. Checked against each thread's own clock."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from bench.thread_cpu import ThreadsCpu, thread_ids

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def test_another_threads_cpu_time_is_read_as_that_thread_reads_it() -> None:
    before = thread_ids()
    started, release = threading.Event(), threading.Event()
    own: list[int] = []

    def busy() -> None:
        started.set()
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 60_000_000:  # 60 ms of CPU
            pass
        own.append(time.thread_time_ns())
        release.wait()

    worker = threading.Thread(target=busy, name="busy", daemon=True)
    worker.start()
    try:
        started.wait()
        threads = ThreadsCpu(thread_ids() - before)
        assert len(threads.names) == 1  # only the new thread (Python names not the OS's)
        while not own:
            time.sleep(0.01)
        read = threads.ns()  # the worker is parked now: its clock no longer moves
    finally:
        release.set()
        worker.join()
    assert abs(read - own[0]) < 2_000_000, (read, own[0])
