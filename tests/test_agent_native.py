"""Tier 1: the agent's C seam (agent/_seam.c) against its Python twin (agent/host_seam.py).

Both record a host collective as the same list and time its ``wait()`` by the same rules; the
Python one is the reference. Each test drives both with the same works and compares what
comes out, times aside (checked against the caller's own clock instead).
"""

from __future__ import annotations

import sys
import time
import weakref
from datetime import timedelta
from typing import Any

import pytest

from zeroscope.agent import host_seam
from zeroscope.agent.collective_record import END, EXPOSED, REF, START
from zeroscope.agent.host_seam import Recorder

IMPLEMENTATIONS = ["C", "Python"]


def make(kind: str, fallback: Any = None) -> Any:
    if kind == "Python":
        return Recorder(fallback)
    if host_seam.NATIVE is None:
        if not sys.platform.startswith("linux"):
            pytest.skip("the C seam is built on Linux only")
        pytest.fail("agent/_seam.c was not built: run `pip install -e .` (needs gcc)")
    return host_seam.NATIVE(fallback)


class Work:
    """A Work whose ``wait`` takes ``wait_s``, may raise, and notes its arguments."""

    def __init__(self, wait_s: float = 0.0, fails: bool = False) -> None:
        self.wait_s, self.fails = wait_s, fails
        self.waits: list[tuple[Any, ...]] = []
        self.tag = "mine"

    def wait(self, *args: Any) -> bool:
        self.waits.append(args)
        time.sleep(self.wait_s)
        if self.fails:
            raise RuntimeError("peer gone")
        return True

    def is_completed(self) -> int:
        return 1  # truthy, not a bool: the handle says True

    def get_future(self) -> str:
        return "future"


def test_the_c_seam_is_built_on_linux() -> None:
    """`pip install -e .` builds it (setup.py); where it silently failed, the agent would run
    ~4 us slower per collective with nothing saying why."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the C seam is built on Linux only")
    from zeroscope.agent import _seam

    assert host_seam.NATIVE is _seam.Recorder
    before = time.perf_counter_ns()
    now = _seam.now_ns()
    assert before <= now <= time.perf_counter_ns()  # the same clock as perf_counter_ns


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_record_is_the_same_list_and_its_wait_is_timed(kind: str) -> None:
    recorder = make(kind)
    work = Work(wait_s=0.02)
    t0 = time.perf_counter_ns()
    handle = recorder(work, op="all_gather", nbytes=4096, group_size=4, label="layers.0")
    (rec,) = recorder.pending
    assert rec[:START] == ["all_gather", 4096, 4, False, "layers.0"]
    assert t0 <= rec[START] <= time.perf_counter_ns()
    assert rec[END] is None and rec[EXPOSED] == 0 and rec[REF]() is work
    assert handle.work is work and handle.record is rec
    assert handle.wait() is True and work.waits == [()]
    assert rec[EXPOSED] >= 0.02e9 and rec[START] + rec[EXPOSED] <= rec[END]
    assert rec[END] <= time.perf_counter_ns()
    first_end = rec[END]
    handle.wait(timedelta(seconds=5))  # a second wait: more exposed time, the end stays
    handle.wait(timeout=timedelta(seconds=6))
    assert work.waits[1:] == [(timedelta(seconds=5),), (timedelta(seconds=6),)]
    assert rec[END] == first_end and rec[EXPOSED] >= 0.06e9
    assert recorder.host_ended == 1 and recorder.collective_ns > 0
    # The rest is the Work's.
    assert handle.is_completed() is True and handle.get_future() == "future"
    assert handle.tag == "mine"
    with pytest.raises(AttributeError):
        handle.no_such_attribute  # noqa: B018
    assert recorder.take() == [rec] and recorder.pending == [] and recorder.take() == []


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_failing_wait_raises_its_own_error_and_is_still_timed(kind: str) -> None:
    recorder = make(kind)
    handle = recorder(Work(wait_s=0.01, fails=True), op="all_reduce", nbytes=8, group_size=2)
    with pytest.raises(RuntimeError, match="peer gone"):
        handle.wait()
    (rec,) = recorder.pending
    assert rec[END] is not None and rec[EXPOSED] >= 0.01e9 and recorder.host_ended == 1


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_the_agent_holds_no_work_and_a_bad_call_is_refused_like_pythons(kind: str) -> None:
    recorder = make(kind)
    work = Work()
    alive = weakref.ref(work)
    recorder(work, op="broadcast", nbytes=1, group_size=2, prefetched=True)
    del work
    assert alive() is None  # only a weak reference in the record
    (rec,) = recorder.pending
    assert rec[3] is True and rec[4] == "" and rec[REF]() is None
    with pytest.raises(TypeError):
        recorder(Work(), op="all_reduce", nbytes=8)  # group_size missing
    with pytest.raises(TypeError):
        recorder(Work(), op="all_reduce", nbytes=8, group_size=2, colour="red")
    with pytest.raises(TypeError):
        recorder(Work(), "all_reduce", 8, 2)  # keywords only, as Telemetry.collective
    with pytest.raises(TypeError):
        recorder(Work(), op="x", nbytes=1, group_size=2).wait(1, 2)
    assert len(recorder.pending) == 2  # the refused calls recorded nothing; the last did


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_a_work_that_cannot_be_weakly_referenced_goes_to_the_fallback(kind: str) -> None:
    calls: list[tuple[Any, ...]] = []

    def fallback(*args: Any) -> str:
        calls.append(args)
        return "tracked elsewhere"

    recorder = make(kind, fallback)
    t0 = time.perf_counter_ns()
    out = recorder(7, op="all_reduce", nbytes=8, group_size=2, label="x")  # an int: no weakref
    assert out == "tracked elsewhere" and recorder.pending == []
    ((work, op, nbytes, group, prefetched, label, start),) = calls
    assert (work, op, nbytes, group, prefetched, label) == (7, "all_reduce", 8, 2, False, "x")
    assert t0 <= start <= time.perf_counter_ns()


def test_the_two_seams_give_the_same_reports(seam: str) -> None:
    """A whole step through the live agent with each seam: the same collectives on the wire
    (tests/conftest.py runs this once per seam; the figures are checked against this clock)."""
    from tests.test_agent_timeline import Sink
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.schema import MemoryBytes

    sink = Sink()
    tel = LiveTelemetry(sink, sample_interval=60.0)  # type: ignore[arg-type]
    sink.drain = tel.drain
    try:
        for _ in range(2):  # step 1's first op goes through the method, later ones not
            handles = [
                tel.collective(Work(wait_s=0.005), op="all_gather", nbytes=n, group_size=2)
                for n in (8, 16)
            ]
            dropped = tel.collective(Work(), op="reduce_scatter", nbytes=32, group_size=2)
            del dropped  # never waited: ends at the step boundary
            for h in handles:
                h.wait()
            tel.step_end(memory=MemoryBytes())
        reports = sink.reports()
    finally:
        tel.close()
    assert [r.step for r in reports] == [1, 2]
    for r in reports:
        assert [(c.op, c.nbytes) for c in r.collectives] == [
            ("all_gather", 8),
            ("all_gather", 16),
            ("reduce_scatter", 32),
        ]
        assert r.collectives_unfinished == 0
        gathers = r.collectives[:2]
        assert all(0.005 <= c.exposed_s <= c.duration_s <= r.duration_s for c in gathers)
    cost = tel.cost
    assert (cost.collectives, cost.steps) == (6, 2) and cost.collective_ns > 0


def test_an_agents_tracker_and_its_recorder_are_collected(seam: str) -> None:
    """The recorder's fallback is its tracker's method: a cycle the garbage collector must be
    able to break (a process that makes agents, tests among them, would keep every one)."""
    import gc

    from zeroscope.agent.comm import CollectiveTracker

    tracker = CollectiveTracker(cuda=False)
    tracker.recorder(Work(), op="all_reduce", nbytes=8, group_size=2)
    gone = weakref.ref(tracker)
    del tracker
    gc.collect()
    assert gone() is None


def records(rng: Any, n: int, step_start: int) -> list[list[Any]]:
    """Host records as the recorder makes them, with the corner cases: an end before its
    start (clock order), exposed longer than the op (wait() overhead), huge sizes."""
    out = []
    for i in range(n):
        start = step_start + rng.randrange(-(10**6), 10**9)
        end = start + rng.choice([0, -5, rng.randrange(1, 10**8)])
        exposed = rng.choice([0, rng.randrange(0, 2 * 10**8)])
        op = rng.choice(["all_gather", "reduce_scatter", "all_reduce"])
        nbytes = rng.choice([1, 2**40, rng.randrange(1, 10**9)])
        out.append(
            [op, nbytes, rng.choice([1, 2, 8]), i % 3 == 0, f"L{i}", start, end, exposed, None]
        )
    return out


def test_the_senders_resolution_is_the_same_in_c_and_in_python() -> None:
    """The sender's bulk resolution of a step's host records (agent/_seam.c ``resolve_hosts``)
    against its Python twin, field for field; and the same None when a record is in flight
    or is not a host record."""
    import random

    from zeroscope.agent.host_seam import resolve_hosts_python
    from zeroscope.agent.schema import Collective

    make("C")  # skips off Linux, fails where the seam was not built
    resolve_c = host_seam._seam.resolve_hosts
    rng = random.Random(18)
    step_start = 10**12
    for n in (0, 1, 195):
        recs = records(rng, n, step_start)
        python = resolve_hosts_python(recs, step_start)
        assert python is not None
        assert resolve_c(recs, step_start, Collective) == python
    recs = records(rng, 5, step_start)
    recs[3][END] = None  # in flight
    assert resolve_c(recs, step_start, Collective) is None
    assert resolve_hosts_python(recs, step_start) is None
    recs[3] = object()  # a device record (agent/comm.py's CollectiveRecord), not a list
    assert resolve_c(recs, step_start, Collective) is None
    assert resolve_hosts_python(recs, step_start) is None
