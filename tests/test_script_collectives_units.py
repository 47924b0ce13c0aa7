"""The watch of the default group for collectives beside the ones a job reports
(agent/script_collectives.py), on a scripted Flight Recorder: a step whose entries are as many as
the engine's records is the engine's and costs no dump; a step with more is read once and the
rest, matched in order, is the script's; entries that do not line up with the engine's records
add nothing and are said once. tests/test_engine_script_collectives.py runs it in a real job."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.test_flight_recorder import _entry, _Group
from zeroscope.agent import script_collectives as sc
from zeroscope.agent.attach.flight_recorder import FlightRecorderReader, RecorderOp
from zeroscope.agent.collective_record import FIELDS
from zeroscope.agent.schema import Collective


def _host(op: str, nbytes: int, group: int = 2) -> list[Any]:
    """An engine's host record (agent/collective_record.py), ended."""
    rec: list[Any] = [None] * len(FIELDS)
    rec[0], rec[1], rec[2] = op, nbytes, group
    return rec


class _Ring:
    def __init__(self) -> None:
        self.entries: list[dict] = []
        self.dumps = 0

    def dump(self) -> bytes:
        self.dumps += 1
        return json.dumps({"entries": self.entries}).encode()


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    ring = _Ring()
    reader = FlightRecorderReader(dump=ring.dump)
    monkeypatch.setattr(sc, "READER", reader)
    monkeypatch.setattr(
        sc, "_say_unmatched", lambda read, engine, ring: said.append((read, engine, ring))
    )
    said: list[tuple[int, int, int]] = []
    group = _Group("0")
    w = sc.ScriptWatch(group, 2)
    return w, group, ring, said


def _step(w: sc.ScriptWatch, group: _Group, ring: _Ring, issued: list, engine: list) -> list:
    """One step: ``issued`` (profiling name, numel) entries on the group, ``engine`` the
    engine's records; what the step's mark reads beside them, as (op, bytes, label)."""
    for name, numel in issued:
        group.seq += 1
        ring.entries.append(_entry(group.seq, name=f"gloo:{name}", numel=numel))
    records = [_host(op, nbytes) for op, nbytes in engine]
    mark = w.mark(records)
    assert mark is not None
    assert mark.due(now_ns=0, cpu_ns=0) in (True, False)
    return [(c.op, c.nbytes, c.label) for c in (op.resolve(0) for op in mark.expand())]


def test_the_engines_own_step_is_claimed_without_a_dump(watch: Any) -> None:
    w, group, ring, _ = watch
    engine = [("all_gather", 80), ("reduce_scatter", 40), ("all_reduce", 4)]
    # gloo runs the engine's reduce-scatter as an all-reduce of the same bytes
    issued = [("all_gather", 10), ("all_reduce", 10), ("all_reduce", 1)]
    for _ in range(3):
        assert _step(w, group, ring, issued, engine) == []
    assert ring.dumps == 0 and not w.active
    assert w.mark([]) is None  # nothing issued on the group: no mark at all


def test_a_step_with_more_reads_the_scripts_in_order(watch: Any) -> None:
    w, group, ring, said = watch
    engine = [("all_gather", 80), ("all_reduce", 4), ("all_reduce", 4)]
    # The script's own: a 4-byte all-reduce between the engine's two (the same op and bytes:
    # which of the three is the script's cannot matter), then a barrier and a broadcast.
    issued = [
        ("all_gather", 10),
        ("all_reduce", 1),
        ("all_reduce", 1),
        ("all_reduce", 1),
        ("barrier", 0),
        ("broadcast", 64),
    ]
    got = _step(w, group, ring, issued, engine)
    assert got == [
        ("all_reduce", 4, "script"),
        ("barrier", 0, "script"),
        ("broadcast", 256, "script"),
    ]
    assert ring.dumps == 1 and w.active and not said
    # The next step, the engine's own again: claimed, no dump.
    assert (
        _step(w, group, ring, [("all_gather", 10), ("all_reduce", 1), ("all_reduce", 1)], engine)
        == []
    )
    assert ring.dumps == 1


def test_entries_that_do_not_line_up_add_nothing_are_said_once_and_stop_the_reads(
    watch: Any,
) -> None:
    w, group, ring, said = watch
    engine = [("all_gather", 80), ("all_reduce", 4)]
    # A recorder op the engine's records hold otherwise (a 12-byte all-reduce where the engine
    # said 4), or a ring overwritten before the read: nothing is guessed.
    issued = [("all_gather", 10), ("all_reduce", 3), ("barrier", 0)]
    assert _step(w, group, ring, issued, engine) == []
    assert said == [(3, 2, 64)] and w.off and ring.dumps == 1
    # From there no mark (a ring a step overfills would cost a dump a step for nothing).
    group.seq += 3
    assert w.mark([_host("all_gather", 80)]) is None
    assert ring.dumps == 1 and said == [(3, 2, 64)]


def test_an_unreadable_group_stops_the_watch_and_never_the_step(watch: Any) -> None:
    w, group, _, _ = watch

    def gone() -> int:
        raise RuntimeError("the group was destroyed")

    group._get_sequence_number_for_group = gone
    assert w.mark([]) is None and w.off


def test_beside_matches_in_order_by_op_and_bytes() -> None:
    def ops(*pairs: tuple[str, int]) -> list[RecorderOp]:
        return [
            RecorderOp(
                Collective(
                    op=op, nbytes=n, group_size=2, start_s=0.0, duration_s=0.0, exposed_s=0.0
                ),
                i,
            )
            for i, (op, n) in enumerate(pairs)
        ]

    read = ops(("broadcast", 8), ("all_gather", 80), ("all_reduce", 40), ("all_reduce", 4))
    found = sc.beside(read, [("all_gather", 80), ("reduce_scatter", 40)])
    assert found is not None
    assert [(o._collective.op, o._collective.nbytes) for o in found] == [
        ("broadcast", 8),
        ("all_reduce", 4),
    ]
    # An engine op with no entry (the ring overwritten): None, never a guess.
    assert sc.beside(read, [("all_gather", 80), ("all_gather", 80)]) is None
    # A reduce-scatter never matches an all-gather of the same bytes.
    assert sc.beside(ops(("all_gather", 40)), [("reduce_scatter", 40)]) is None
