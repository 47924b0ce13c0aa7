"""Tier 1: one collective record, one wait bookkeeping and one resolver for every recorder
(agent/collective_record.py): the engine's host seam in Python and in C, its device path, the
attach's wrappers and its Flight Recorder reader; and the step's facts built by keyword.

The wire's Collective is an array-like struct: built positionally, a field added or moved in
agent/schema.py would shift every value after it into its neighbour's place with nothing
failing. Each test here swaps in a struct with the fields in reverse order (every one with a
default, so a positional build succeeds silently) and reads the figures back by name."""

from __future__ import annotations

import random
import sys
import types
import weakref
from typing import Any

import msgspec
import pytest

from zeroscope.agent import collective_record, host_seam
from zeroscope.agent.collective_record import (
    END,
    EXPOSED,
    FIELDS,
    LABEL,
    OP,
    START,
    book_wait_python,
    to_wire,
)
from zeroscope.agent.schema import Collective

NAMES = Collective.__struct_fields__

Reordered = msgspec.defstruct(
    "Reordered", [(name, Any, None) for name in reversed(NAMES)], array_like=True
)
"""The wire's Collective with its fields in reverse order: what a reordered schema would be."""

STEP_START = 10**12
EXPECTED = {
    "op": "reduce_scatter",
    "nbytes": 4096,
    "group_size": 4,
    "start_s": 1.5,
    "duration_s": 0.25,
    "exposed_s": 0.125,
    "prefetched": True,
    "label": "layer.3",
    "clock": "host",
    "exposed_measured": True,
}
"""One collective whose every field differs from the others (each read back by name)."""


@pytest.fixture
def reordered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collective_record, "Collective", Reordered)


def by_name(c: Any) -> dict[str, Any]:
    assert type(c) is Reordered  # built through the one resolver, not a local Collective
    return {name: getattr(c, name) for name in NAMES}


def host_record() -> list[Any]:
    start = STEP_START + 1_500_000_000
    rec: list[Any] = [None] * len(FIELDS)
    rec[OP], rec[collective_record.NBYTES], rec[collective_record.GROUP] = "reduce_scatter", 4096, 4
    rec[collective_record.PREFETCHED], rec[LABEL], rec[START] = True, "layer.3", start
    rec[END], rec[EXPOSED] = start + 250_000_000, 125_000_000
    return rec


@pytest.mark.usefixtures("reordered")
def test_the_host_seams_resolution_sets_each_field_by_name(seam: str) -> None:
    """agent/host_seam.py's bulk resolution, in C (``_seam.resolve_hosts``) and in Python
    (tests/conftest.py runs this once per seam)."""
    (c,) = host_seam.resolve_hosts([host_record()], STEP_START) or [None]
    assert by_name(c) == EXPECTED


@pytest.mark.usefixtures("reordered")
def test_the_device_paths_record_sets_each_field_by_name() -> None:
    """agent/comm.py's CollectiveRecord (CUDA ops, and host works timed by their future)."""
    from zeroscope.agent.comm import CollectiveRecord

    start = STEP_START + 1_500_000_000
    rec = CollectiveRecord("reduce_scatter", 4096, 4, True, "layer.3", start)
    rec.end_ns, rec.exposed_ns = start + 250_000_000, 125_000_000
    assert by_name(rec.resolve(STEP_START)) == EXPECTED


@pytest.mark.usefixtures("reordered")
def test_the_attachs_record_sets_each_field_by_name() -> None:
    """agent/attach/collectives.py: the attach's record is the host layout with a tail; a
    waited op is host-timed, one only the step boundary saw end has NA duration and exposed."""
    from zeroscope.agent.attach.collectives import MEASURED, CollectiveLog, LoggedOp

    log = CollectiveLog()
    log.label = "layer.3"
    start = STEP_START + 1_500_000_000
    log.add("reduce_scatter", 4096, 4, start, None, cuda=False)
    (rec,) = log.records
    rec[collective_record.PREFETCHED] = True  # the attach never says; the layout has the slot
    book_wait_python(rec, start + 125_000_000, start + 250_000_000)
    rec[MEASURED] = True
    assert by_name(LoggedOp(rec, {}).resolve(STEP_START)) == EXPECTED
    rec[MEASURED] = False  # its end was stamped at a step boundary: no clock saw it
    unmeasured = by_name(LoggedOp(rec, {}).resolve(STEP_START))
    assert unmeasured == {
        **EXPECTED,
        "duration_s": 0.0,
        "exposed_s": 0.0,
        "clock": "none",
        "exposed_measured": False,
    }


@pytest.mark.usefixtures("reordered")
def test_the_flight_recorders_entry_sets_each_field_by_name() -> None:
    from zeroscope.agent.attach.flight_recorder import collective_of

    entry = {
        "profiling_name": "nccl:reduce_scatter",
        "input_sizes": [[1024]],
        "input_dtypes": ["Float"],
        "output_sizes": [[256]],
        "output_dtypes": ["Float"],
        "time_created_ns": 1_500_000_000,
        "duration_ms": 250.0,
        "state": "completed",
    }
    got = by_name(collective_of(entry, 4, "layer.3"))
    assert got == {
        **EXPECTED,
        "prefetched": False,
        "exposed_s": 0.0,
        "clock": "device",
        "exposed_measured": False,
    }


def test_exposed_is_capped_at_the_duration_and_na_is_never_a_figure() -> None:
    """The one place "exposed <= duration" holds: a wait's own overhead after the op ended is
    not comm time; a duration no clock saw is clock ``none``, an unmeasured wait is NA."""
    base = {"op": "all_reduce", "nbytes": 8, "group_size": 2, "start_s": 0.0}
    capped = to_wire(**base, duration_s=0.002, exposed_s=0.003)
    assert (capped.duration_s, capped.exposed_s, capped.clock) == (0.002, 0.002, "host")
    backwards = to_wire(**base, duration_s=-1e-6, exposed_s=0.001)
    assert (backwards.duration_s, backwards.exposed_s) == (0.0, 0.0)
    unseen = to_wire(**base, duration_s=None, exposed_s=0.004, clock="device")
    # The duration is NA, the loop's measured stall is kept whole (nothing to cap it by).
    assert (unseen.clock, unseen.duration_s, unseen.exposed_s) == ("none", 0.0, 0.004)
    assert unseen.exposed_measured
    blind = to_wire(**base, duration_s=0.002, exposed_s=None, clock="device")
    assert (blind.clock, blind.exposed_s, blind.exposed_measured) == ("device", 0.0, False)


def test_the_c_seam_records_in_the_one_layout() -> None:
    """agent/_seam.c's record layout is agent/collective_record.py's, and a record it makes
    puts each value where the Python twin reads it."""
    if host_seam.NATIVE is None:
        if not sys.platform.startswith("linux"):
            pytest.skip("the C seam is built on Linux only")
        pytest.fail("agent/_seam.c was not built: run `pip install -e .` (needs gcc)")
    from zeroscope.agent import _seam

    assert _seam.FIELDS == FIELDS

    class Work:
        def wait(self) -> None:
            return None

    work = Work()
    recorder = _seam.Recorder(None)
    recorder(work, op="broadcast", nbytes=12, group_size=3, prefetched=True, label="emb")
    (rec,) = recorder.take()
    named = dict(zip(FIELDS, rec, strict=True))
    assert {k: named[k] for k in ("op", "nbytes", "group_size", "prefetched", "label")} == {
        "op": "broadcast",
        "nbytes": 12,
        "group_size": 3,
        "prefetched": True,
        "label": "emb",
    }
    assert named["end_ns"] is None and named["exposed_ns"] == 0
    assert isinstance(named["ref"], weakref.ref) and named["ref"]() is work


def test_the_wait_bookkeeping_is_the_same_in_c_and_in_python() -> None:
    """``_seam.book_wait`` (the engine's C seam and the attach's ``Work.wait`` wrapper) against
    its Python twin, over random waits: the same records, the same "first end" answers."""
    if collective_record._book_wait_c is None:
        pytest.skip("the C seam is built on Linux only")
    c_book = collective_record._book_wait_c
    rng = random.Random(30)
    for _ in range(200):
        start = rng.randrange(0, 10**12)
        py_rec = [None] * len(FIELDS)
        py_rec[START], py_rec[EXPOSED] = start, 0
        py_rec[END] = rng.choice([None, start + rng.randrange(0, 10**9)])
        c_rec = list(py_rec)
        for _ in range(rng.randrange(1, 4)):
            t0 = start + rng.randrange(0, 10**9)
            t1 = t0 + rng.randrange(0, 10**8)
            assert c_book(c_rec, t0, t1) == book_wait_python(py_rec, t0, t1)
        assert c_rec == py_rec
    assert c_book(object(), 1, 2) is False  # not a record: nothing booked, nothing raised


def test_the_steps_facts_are_built_by_keyword_only() -> None:
    """StepFacts takes keywords only, and its figures are a named record read by name: a
    reordered constructor cannot shift the loss scale into the learning rate."""
    from zeroscope.agent.pending import StepFacts, StepFigures
    from zeroscope.agent.scalars import NO_SCALAR
    from zeroscope.agent.schema import MemoryBytes

    with pytest.raises(TypeError):
        StepFacts(0, 1)  # type: ignore[misc]
    figures = StepFigures(
        lr=3e-4, loss_scale=1024.0, overflow=False, skipped=True, samples=7, host=None
    )
    facts = StepFacts(
        rank=2,
        step=5,
        wall_ns=11,
        end_ns=13,
        end_event=None,
        marks=[],
        records=[],
        memory=MemoryBytes(),
        loss=NO_SCALAR,
        grad_norm=NO_SCALAR,
        activations=None,
        blocks=None,
        device=(1, 2, 3),
        transfers=[],
        pipeline=None,
        figures=figures,
        overhead_ns=17_000,
    )
    axis = types.SimpleNamespace(forward_seen=False, start_ns=0)
    r = facts.report(axis)  # type: ignore[arg-type]
    assert (r.rank, r.step, r.wall_ns) == (2, 5, 11)
    assert (r.lr, r.loss_scale, r.overflow, r.skipped, r.samples) == (3e-4, 1024.0, False, True, 7)
    assert (r.memory.device_allocated, r.memory.device_reserved, r.memory.device_peak) == (1, 2, 3)
    assert r.agent_overhead_s == 17e-6
