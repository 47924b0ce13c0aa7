"""The Flight Recorder reader (agent/attach/flight_recorder.py) on a scripted dump, and on torch's
own recorder in a 2-rank gloo job: each entry of a watched group is taken once, the ones the
ProcessGroup wrappers recorded themselves are left to them, an overwritten one is counted lost,
bytes follow nccl-tests, and nothing is timed where torch measured nothing."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from zeroscope.agent.attach.flight_recorder import FlightRecorderReader, collective_of


class _Group:
    def __init__(self, name: str) -> None:
        self.group_name = name
        self.seq = 0

    def size(self) -> int:
        return 2

    def _get_sequence_number_for_group(self) -> int:
        return self.seq


NOW_WALL, NOW_PERF = time.time_ns(), time.perf_counter_ns()


def _entry(seq: int, name: str = "gloo:all_reduce", numel: int = 10, **kw: Any) -> dict:
    e = {
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "profiling_name": name,
        "input_sizes": [[numel]],
        "input_dtypes": ["Float"],
        "output_sizes": [[2 * numel]] if "gather" in name else [[numel]],
        "output_dtypes": ["Float"],
        "time_created_ns": NOW_WALL + seq * 10**6,  # issued 1 ms apart
        "state": "scheduled",
        "is_p2p": False,
    }
    e.update(kw)
    return e


def test_each_entry_is_taken_once_claimed_ones_are_left_and_overwritten_ones_are_lost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "4")
    entries: list[dict] = []
    reader = FlightRecorderReader(dump=lambda: json.dumps({"entries": entries}).encode())
    group = _Group("0")
    group.seq = 3  # issued before the model was built: never taken
    reader.watch(group, "DDP")
    # Step 1: seq 4 (the reducer's), 5 (a wrapped call, claimed), 6 (the reducer's).
    entries[:] = [_entry(s) for s in (3, 4, 5, 6)]
    group.seq = 5
    reader.claim(group, 4)  # the wrapper read 4 before its call, 5 after
    group.seq = 6
    mark = reader.mark()
    assert mark is not None and mark.marks == {"0": 6}
    ops = mark.expand()
    # Wall clock (torch's) to this step's host axis: seq 4 issued 4 ms after NOW_PERF.
    got = [(op.resolve(NOW_PERF).nbytes, op.resolve(NOW_PERF).start_s) for op in ops]
    assert got == [(40, pytest.approx(4e-3, abs=5e-3)), (40, pytest.approx(6e-3, abs=5e-3))]
    assert got[1][1] - got[0][1] == pytest.approx(2e-3, abs=1e-6)
    assert all(op.resolve(0).clock == "none" for op in ops)
    assert mark.expand() == []  # taken once
    # Step 2: seqs 7..10; the ring (4 entries) kept only 8..11 when read: 7 is lost.
    group.seq = 10
    mark = reader.mark()
    entries[:] = [_entry(s) for s in (8, 9, 10, 11)]
    assert mark is not None and len(mark.expand()) == 3
    assert reader.lost == 1
    assert "ring (4 entries) was overwritten" in capsys.readouterr().err


def test_bytes_follow_nccl_tests_and_a_device_duration_is_the_device_clock() -> None:
    ag = collective_of(_entry(1, "nccl:_allgather_base", numel=8), 2, "")
    rs = collective_of(
        _entry(
            2,
            "nccl:_reduce_scatter_base",
            numel=16,
            input_dtypes=["BFloat16"],
            duration_ms=2.5,
            state="completed",
        ),
        2,
        "",
    )
    assert ag is not None and (ag.op, ag.nbytes, ag.clock) == ("all_gather", 64, "none")
    assert rs is not None and (rs.op, rs.nbytes, rs.clock) == ("reduce_scatter", 32, "device")
    assert rs.duration_s == pytest.approx(2.5e-3) and not rs.exposed_measured
    assert collective_of(_entry(3, "gloo:barrier"), 2, "") is None  # no wire op


def test_a_recorder_that_is_off_is_said_once_and_reads_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    reader = FlightRecorderReader(dump=lambda: b"{}")
    reader.watch(_Group("0"), "DDP")
    reader.watch(_Group("1"), "DDP")
    assert reader.mark() is None and "TORCH_FR_BUFFER_SIZE" in reader.off_reason
    assert capsys.readouterr().err.count("not seen") == 1  # said once, for both groups
