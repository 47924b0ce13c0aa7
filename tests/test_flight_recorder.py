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


def _entry(
    seq: int, name: str = "gloo:all_reduce", numel: int = 10, wall_ns: int = 0, **kw: Any
) -> dict:
    """One ring entry, issued ``seq`` ms after ``wall_ns`` (torch's wall clock)."""
    e = {
        "process_group": ["0", "default_pg"],
        "collective_seq_id": seq,
        "profiling_name": name,
        "input_sizes": [[numel]],
        "input_dtypes": ["Float"],
        "output_sizes": [[2 * numel]] if "gather" in name else [[numel]],
        "output_dtypes": ["Float"],
        "time_created_ns": wall_ns + seq * 10**6,  # issued 1 ms apart
        "state": "scheduled",
        "is_p2p": False,
    }
    e.update(kw)
    return e


def test_each_entry_is_taken_once_claimed_ones_are_left_and_overwritten_ones_are_lost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "4")
    # Both clocks read now, not at import: minutes of a busy suite lie between the two, and the
    # wall clock may be slewed or stepped meanwhile (a 0.73 s step failed a CI run).
    now_wall, now_perf = time.time_ns(), time.perf_counter_ns()
    entries: list[dict] = []
    reader = FlightRecorderReader(dump=lambda: json.dumps({"entries": entries}).encode())
    group = _Group("0")
    group.seq = 3  # issued before the model was built: never taken
    reader.watch(group, "DDP")
    # Step 1: seq 4 (the reducer's), 5 (a wrapped call, claimed), 6 (the reducer's).
    entries[:] = [_entry(s, wall_ns=now_wall) for s in (3, 4, 5, 6)]
    group.seq = 5
    reader.claim(group, 4)  # the wrapper read 4 before its call, 5 after
    group.seq = 6
    mark = reader.mark()
    assert mark is not None and mark.marks == {"0": 6}
    ops = mark.expand()
    # Wall clock (torch's) to this step's host axis: seq 4 issued 4 ms after now_perf.
    got = [(op.resolve(now_perf).nbytes, op.resolve(now_perf).start_s) for op in ops]
    assert got == [(40, pytest.approx(4e-3, abs=5e-3)), (40, pytest.approx(6e-3, abs=5e-3))]
    assert got[1][1] - got[0][1] == pytest.approx(2e-3, abs=1e-6)
    assert all(op.resolve(0).clock == "none" for op in ops)
    assert mark.expand() == []  # taken once
    # Step 2: seqs 7..10; the ring (4 entries) kept only 8..11 when read: 7 is lost.
    group.seq = 10
    mark = reader.mark()
    entries[:] = [_entry(s, wall_ns=now_wall) for s in (8, 9, 10, 11)]
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
    assert collective_of(_entry(3, "gloo:an_op_of_a_later_torch"), 2, "") is None  # no wire op
    # gather / scatter: S is the whole size, a rank's share (its input / output) times the group
    gather = collective_of(_entry(6, "gloo:gather", numel=4), 2, "")
    scatter = collective_of(_entry(7, "gloo:scatter", numel=4, output_sizes=[[4]]), 2, "")
    assert gather is not None and (gather.op, gather.nbytes) == ("gather", 32)
    assert scatter is not None and (scatter.op, scatter.nbytes) == ("scatter", 32)
    nothing: dict[str, Any] = {key: [] for key in ("input_sizes", "input_dtypes")}
    barrier = collective_of(_entry(4, "gloo:barrier", **nothing, output_sizes=[]), 2, "")
    assert barrier is not None and (barrier.op, barrier.nbytes) == ("barrier", 0)
    a2a = collective_of(_entry(5, "nccl:all_to_all", numel=6), 2, "")
    assert a2a is not None and (a2a.op, a2a.nbytes) == ("all_to_all", 24)  # what it sends


def test_a_recorder_that_is_off_is_said_once_and_reads_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    reader = FlightRecorderReader(dump=lambda: b"{}")
    reader.watch(_Group("0"), "DDP")
    reader.watch(_Group("1"), "DDP")
    assert reader.mark() is None and "TORCH_FR_BUFFER_SIZE" in reader.off_reason
    assert capsys.readouterr().err.count("not seen") == 1  # said once, for both groups


class _Ring:
    """torch's Flight Recorder as the reader meets it: one process-wide ring of ``size``
    entries over every group, each entry numbered by a process-wide ``record_id``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: list[dict] = []
        self.records = 0

    def issue(self, group: _Group) -> None:
        group.seq += 1
        self.records += 1
        e = _entry(group.seq, process_group=[group.group_name, ""], record_id=self.records)
        self.entries = [*self.entries, e][-self.size :]

    def dump(self) -> bytes:
        return json.dumps({"entries": self.entries}).encode()


def _run_steps(wake_on_urgent: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int, int]:
    """A DDP-shaped job: per step two all-reduces on the watched group and two on another
    group (FSDP2's, a scaler's: the ring is shared) into a ring of 8. The sender reads every
    fourth step (its half-second wake-up, for short steps), and at once on an urgent mark if
    ``wake_on_urgent``. Returns (entries taken, entries issued on the watched group, lost)."""
    from zeroscope.agent.attach.session import SESSION

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "8")
    monkeypatch.setattr(SESSION, "_lost", {})  # said once per process: a fresh one per run
    ring = _Ring(8)
    reader = FlightRecorderReader(dump=ring.dump)
    watched, other = _Group("0"), _Group("1")
    reader.watch(watched, "DDP")
    marks: list[Any] = []
    taken = 0
    for step in range(1, 13):
        for _ in range(2):
            ring.issue(watched)
            ring.issue(other)
        mark = reader.mark()
        assert mark is not None
        marks.append(mark)
        if step % 4 == 0 or (wake_on_urgent and mark.urgent):
            taken += sum(len(m.expand()) for m in marks)
            marks.clear()
    return taken, watched.seq, reader.lost


def test_a_half_full_ring_wakes_the_sender_so_no_collective_is_lost(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The sender's interval alone (what the reader relied on before): 16 entries issued
    # between two reads of a ring of 8, so half the watched group's all-reduces were lost.
    taken, issued, lost = _run_steps(False, monkeypatch)
    assert lost > 0 and taken + lost == issued
    # The ring (8) holds two of the largest step's entries (2 watched x share 2 = 4): its size
    # was not the cause, the late read was, and the console says so (not "at least 8").
    err = capsys.readouterr().err
    assert "the agent's sender thread read it late" in err
    assert "at least" not in err
    # Urgent marks (the backlog scaled by the other group's share reaches half the ring):
    # every all-reduce is taken, once.
    taken, issued, lost = _run_steps(True, monkeypatch)
    assert (taken, lost) == (issued, 0)


def test_a_burst_between_two_step_ends_wakes_the_sender_before_the_ring_turns_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An HF Trainer's evaluation after step 3 issues ~130 gathers through the wrappers
    (claimed) before step 4 ends; steps 1-3's reducer entries, unread (short steps: no read
    due yet), were overwritten under it and lost (a real DDP run lost every all-reduce of its
    first three steps)."""
    import threading

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    ring = _Ring(16)
    reader = FlightRecorderReader(dump=ring.dump)
    reader.wake = wake = threading.Event()
    group = _Group("0")
    reader.watch(group, "DDP")
    marks: list[Any] = []
    taken = 0

    def sender() -> None:  # reads only when woken (no time-bound read comes in time)
        nonlocal taken
        if wake.is_set():
            wake.clear()
            taken += sum(len(m.expand()) for m in marks if m.due(now_ns=m.made_ns))
            marks.clear()

    for _ in range(3):  # steps 1-3: one bucket all-reduce each (the reducer's), none urgent
        ring.issue(group)
        mark = reader.mark()
        assert mark is not None and not mark.urgent
        marks.append(mark)
        sender()
    assert taken == 0
    for _ in range(40):  # the evaluation: 40 gathers through the wrappers, 2.5 rings
        before = group.seq
        ring.issue(group)
        reader.claim(group, before)
        sender()
    ring.issue(group)  # step 4's all-reduce
    mark = reader.mark()
    assert mark is not None
    taken += len(mark.expand())
    assert (taken, reader.lost) == (4, 0)  # every reducer entry, none lost


def test_steps_of_their_usual_size_never_wake_the_sender_from_a_collective(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DDP job whose every step also gathers through the wrappers (an HF Trainer's loss
    gathers): the reads stay the step ends' urgent ones, no dump more per step (each walks
    the whole ring: what reading costs the job)."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "128")
    ring = _Ring(128)
    reader = FlightRecorderReader(dump=ring.dump)
    group = _Group("0")
    reader.watch(group, "DDP")
    marks: list[Any] = []
    taken = 0
    for _ in range(60):
        for _ in range(3):  # the step's gathers, claimed
            before = group.seq
            ring.issue(group)
            reader.claim(group, before)
            assert not reader.wanted  # no read asked for between step ends
        ring.issue(group)  # the reducer's all-reduce
        mark = reader.mark()
        assert mark is not None
        marks.append(mark)
        if mark.urgent:
            taken += sum(len(m.expand()) for m in marks)
            marks.clear()
    dumps = reader.dumps
    taken += sum(len(m.expand()) for m in marks)  # the job's end: the rest
    assert reader.lost == 0 and taken == 60  # every reducer entry, once
    assert dumps <= 60 * 4 // (128 - 32)  # one read per ring less its headroom


def _urgent_reads(
    per_step: int,
    steps: int,
    late: int,
    first: int | None = None,
    pattern: tuple[int, ...] = (),
) -> tuple[int, int, int, int]:
    """One watched group issuing ``per_step`` entries per step into a ring of 64; the sender
    reads only when woken by an urgent mark, ``late`` steps after it (a loaded machine), every
    mark handed over by then; the first step issues ``first`` entries if given (a burst), and
    steps cycle through ``pattern``'s entry counts if given. Returns (dumps, entries taken, entries issued, lost)."""
    ring = _Ring(64)
    dumps = [0]

    def dump() -> bytes:
        dumps[0] += 1
        return ring.dump()

    reader = FlightRecorderReader(dump=dump)
    group = _Group("0")
    reader.watch(group, "DDP")
    marks: list[Any] = []
    taken = 0
    due: int | None = None
    for step in range(1, steps + 1):
        count = pattern[(step - 1) % len(pattern)] if pattern else per_step
        for _ in range(first if first is not None and step == 1 else count):
            ring.issue(group)
        mark = reader.mark()
        assert mark is not None
        marks.append(mark)
        if mark.urgent and due is None:
            due = step + late
        if due is not None and step >= due:
            taken += sum(len(m.expand()) for m in marks)
            marks.clear()
            due = None
    return dumps[0], taken, group.seq, reader.lost


def test_the_ring_is_read_when_it_is_three_quarters_full_not_half(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each dump walks the whole ring (its cost is per entry), so reading at half a ring dumped
    every entry twice. With a step's 4 entries, the headroom is a quarter of the ring: read at
    48 of 64, every 12 steps, each entry dumped 64/48 times; nothing lost."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    dumps, taken, issued, lost = _urgent_reads(per_step=4, steps=120, late=0)
    assert (taken, lost) == (issued, 0) and issued == 480
    assert dumps == 480 // 48  # the half-ring threshold read 480 // 32 = 15 times


def test_a_sender_a_step_late_loses_nothing_when_steps_are_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """20 entries per step into 64: a fixed three-quarter threshold (48) would wake the sender
    at 60 unread and a sender one step late would read 80: 16 lost. The headroom is two of the
    largest steps (40), so the mark is urgent at 40 unread and the late read finds 60."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    dumps, taken, issued, lost = _urgent_reads(per_step=20, steps=30, late=1)
    assert (taken, lost) == (issued, 0) and issued == 600
    assert dumps == 10  # every 3 steps: urgent at step 2, read at 3


def test_one_burst_does_not_widen_the_headroom_of_the_steps_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first step of 40 entries (then 4 per step): that step alone sizes the headroom (80,
    more than the ring), so the ring is read at step 1; from step 2 the second largest of the
    recent steps (4) does, and the quarter-ring headroom is back: read every 12 steps (at 48
    unread), at steps 13, 25 and 37. Sized on the largest recent step, the ring was read at each
    of steps 1-8 and at 20 and 32 (10 dumps); with the largest step ever kept, at every step."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    dumps, taken, issued, lost = _urgent_reads(per_step=4, steps=37, late=0, first=40)
    assert (taken, lost) == (issued, 0) and issued == 40 + 36 * 4
    assert dumps == 1 + 3


def test_two_large_steps_keep_the_headroom_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps alternating 20 and 2 entries into 64 with a sender one step late: the second
    largest recent step is a large one, so the headroom stays 40 and nothing is lost (sized on
    the newest step, a small one, the headroom would be a quarter ring and the late read would
    find the ring turned over)."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    _dumps, taken, issued, lost = _urgent_reads(per_step=0, steps=40, late=1, pattern=(20, 2))
    assert (taken, lost) == (issued, 0) and issued == 20 * 22


def test_a_report_waits_for_a_due_read_not_for_each_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sender expands a step's mark (and dumps) only when a read is due: an urgent mark
    (this one or a later one), a dump that reaches it already, or the mark READ_EVERY_S old."""
    from zeroscope.agent.attach.flight_recorder import READ_EVERY_NS

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    ring = _Ring(64)
    dumps = [0]

    def dump() -> bytes:
        dumps[0] += 1
        return ring.dump()

    reader = FlightRecorderReader(dump=dump)
    group = _Group("0")
    reader.watch(group, "DDP")
    ring.issue(group)
    first = reader.mark()
    assert first is not None and not first.urgent
    assert not first.due(first.made_ns + READ_EVERY_NS - 1)  # young, nothing asked: it waits
    assert first.due(first.made_ns + READ_EVERY_NS)  # a live view gets it within READ_EVERY_S
    for _ in range(47):  # 48 unread of 64: the quarter-ring headroom is reached
        ring.issue(group)
    second = reader.mark()
    assert second is not None and second.urgent
    assert first.due(first.made_ns)  # a later urgent mark makes the earlier ones due
    assert len(first.expand()) == 1 and dumps[0] == 1 and not reader.wanted
    assert second.due(second.made_ns)  # the dump reaches it: no second dump
    assert len(second.expand()) == 47 and dumps[0] == 1


def test_a_costly_dump_spaces_the_time_bound_reads_on_the_jobs_cpu_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a dump that cost c of CPU, a mark nothing else makes due waits until the process
    has spent c / READ_BUDGET of CPU (and READ_EVERY_S of wall time), or READ_LATEST_S of wall
    time: the reads' share of the job's CPU stays at the budget however loaded the machine
    (a loaded job gets little CPU per wall second; the wall clock would not see that)."""
    import time

    from zeroscope.agent.attach.flight_recorder import (
        READ_BUDGET,
        READ_EVERY_NS,
        READ_LATEST_NS,
    )

    burn_ns = 3_000_000
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    ring = _Ring(64)

    def dump() -> bytes:
        start = time.thread_time_ns()
        while time.thread_time_ns() - start < burn_ns:  # this much CPU at least, on this thread
            pass
        return ring.dump()

    reader = FlightRecorderReader(dump=dump)
    group = _Group("0")
    reader.watch(group, "DDP")
    ring.issue(group)
    first = reader.mark()
    assert first is not None and first.due(first.made_ns + READ_EVERY_NS)
    before = time.process_time_ns()
    assert len(first.expand()) == 1 and reader.dumps == 1
    spent = time.process_time_ns() - before
    # The dump's own CPU (the thread's clock) over the budget, and the process clock then.
    assert burn_ns / READ_BUDGET <= reader.read_every_cpu_ns <= spent / READ_BUDGET
    assert before <= reader.cpu_at_dump_ns <= time.process_time_ns()
    ring.issue(group)
    second = reader.mark()
    assert second is not None and not second.urgent
    old, at = second.made_ns + READ_EVERY_NS, reader.cpu_at_dump_ns
    assert not second.due(old, at + reader.read_every_cpu_ns - 1)  # the job spent too little
    assert second.due(old, at + reader.read_every_cpu_ns)  # ... now it has spent enough
    young = second.made_ns + READ_EVERY_NS - 1
    assert not second.due(young, at + 10 * reader.read_every_cpu_ns)  # the wall floor holds
    # However little CPU the job got, a report waits at most READ_LATEST_S of wall time.
    assert not second.due(second.made_ns + READ_LATEST_NS - 1, at)
    assert second.due(second.made_ns + READ_LATEST_NS, at)


def test_an_urgent_mark_wakes_the_sender_before_its_interval() -> None:
    from types import SimpleNamespace

    from zeroscope.agent.attach.flight_recorder import RecorderMark
    from zeroscope.agent.outbox import Outbox

    outbox = Outbox(publisher=None, current_step=lambda: 0)
    outbox.put(SimpleNamespace(records=[]), now_ns=0)  # type: ignore[arg-type]
    outbox.wake.clear()
    reader = FlightRecorderReader(dump=lambda: b"{}")
    outbox.put(SimpleNamespace(records=[RecorderMark(reader, {})]), now_ns=1)  # type: ignore[arg-type]
    assert not outbox.wake.is_set()  # within the interval: the next wake-up takes it
    outbox.put(SimpleNamespace(records=[RecorderMark(reader, {}, urgent=True)]), now_ns=2)  # type: ignore[arg-type]
    assert outbox.wake.is_set()


def test_the_ring_size_the_job_set_under_either_name_is_kept() -> None:
    from zeroscope.agent.attach.flight_recorder import (
        DEFAULT_BUFFER,
        configure_environment,
        ring_size,
    )

    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    configure_environment(env)
    assert "TORCH_FR_BUFFER_SIZE" not in env and ring_size(env) == 2000
    env = {}
    configure_environment(env)
    assert ring_size(env) == DEFAULT_BUFFER and env["TORCH_NCCL_ENABLE_TIMING"] == "1"


def test_both_recorders_are_read_as_one_and_each_numbers_its_own_entries(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch's two recorders (NCCL's own and the generic one) are dumped, decoded and indexed
    together: a watched gloo group's entries from one, an NCCL group's device duration from the
    other. Each recorder numbers its entries itself, so the watched group's share of its ring
    is counted within its recorder (1.0 here), not across the two numberings; with neither
    recorder in torch the reader turns itself off and says why."""
    import torch

    from zeroscope.agent.attach import fr_entries
    from zeroscope.agent.attach.session import SESSION

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "1")
    monkeypatch.setattr(SESSION, "_lost", {})
    gloo = [_entry(s, process_group=["0", ""], record_id=s) for s in (1, 2, 3, 4)]
    nccl = [
        _entry(s, "nccl:all_reduce", process_group=["1", ""], record_id=9000 + s) for s in (1, 2)
    ]
    nccl[1].update(state="completed", duration_ms=3.0)

    def as_json(entries: list[dict]) -> Any:
        return lambda with_stack, only_active: json.dumps({"entries": entries}).encode()

    c10d = torch._C._distributed_c10d
    monkeypatch.setattr(c10d, "_dump_fr_trace_json", as_json(gloo), raising=False)
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", as_json(nccl), raising=False)
    reader = FlightRecorderReader()
    group = _Group("0")
    reader.watch(group, "DDP")
    group.seq = 4
    mark = reader.mark()
    assert mark is not None
    ops = mark.expand()
    assert [op.resolve(0).nbytes for op in ops] == [40] * 4 and reader.lost == 0
    assert reader.share == 1.0  # across both numberings it would read (9002 - 1 + 1) / 4
    assert reader.device_duration("1", 2, "all_reduce") == pytest.approx(0.003)
    assert reader.device_duration("1", 1, "all_reduce") is False  # not retired yet
    assert reader.device_duration("1", 2, "broadcast") is None  # never another op's figure
    assert reader.dumps >= 2  # the NCCL group is indexed once asked for

    for name in fr_entries.DUMPS:
        monkeypatch.delattr(c10d, name, raising=False)
    off = FlightRecorderReader()
    off.watch(_Group("0"), "DDP")  # torch has no dump for the group: said as it is watched
    assert "_dump_fr_trace_json" in off.off_reason and not off.groups and off.mark() is None


class _Backend(_Group):
    """A group whose backend torch names (``ProcessGroup.name()``)."""

    def __init__(self, name: str, backend: str) -> None:
        super().__init__(name)
        self.backend = backend

    def name(self) -> str:
        return self.backend


def test_a_cuda_build_without_the_generic_dump_says_so_for_a_gloo_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CUDA build of torch has NCCL's dump beside the generic one. A release without the
    generic dump (the gloo groups' recorder) left NCCL's to be read alone: a watched gloo
    group's entries were then missing from every dump, counted lost, and blamed on a late
    reader ("the ring was overwritten before a read"). The reader now names the dump each
    watched group's entries are in and says the missing one as the group is watched; an NCCL
    group, whose entries are in NCCL's dump, is still read."""
    import torch

    from zeroscope.agent.attach.session import SESSION

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    c10d = torch._C._distributed_c10d
    nccl = [_entry(s, "nccl:all_reduce", process_group=["1", ""], record_id=s) for s in (1, 2)]
    dump = lambda with_stack, only_active: json.dumps({"entries": nccl}).encode()  # noqa: E731
    monkeypatch.setattr(c10d, "_dump_nccl_trace_json", dump, raising=False)
    monkeypatch.delattr(c10d, "_dump_fr_trace_json", raising=False)

    monkeypatch.setattr(SESSION, "_lost", {})
    gloo = FlightRecorderReader()
    gloo.watch(_Backend("0", "gloo"), "DDP")
    assert not gloo.groups and "_dump_fr_trace_json" in gloo.off_reason
    assert gloo.lost == 0 and gloo.mark() is None
    assert "collectives run below Python" in next(iter(SESSION._lost))

    monkeypatch.setattr(SESSION, "_lost", {})
    both = FlightRecorderReader()
    both.watch(_Backend("0", "cpu:gloo,cuda:nccl"), "DDP")  # one backend per device
    assert not both.groups and "_dump_fr_trace_json" in both.off_reason

    reader = FlightRecorderReader()
    group = _Backend("1", "nccl")
    reader.watch(group, "DDP")
    group.seq = 2
    mark = reader.mark()
    assert mark is not None and not reader.off_reason
    assert [op.resolve(0).nbytes for op in mark.expand()] == [40, 40] and reader.lost == 0


def test_a_ring_smaller_than_two_steps_is_told_the_size_it_needs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six watched all-reduces a step into a ring of 8, read every third step, never at an
    urgent mark: the ring cannot hold two steps, and the console names the size that can."""
    from zeroscope.agent.attach.session import SESSION

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "8")
    monkeypatch.setattr(SESSION, "_lost", {})
    ring = _Ring(8)
    reader = FlightRecorderReader(dump=ring.dump)
    watched = _Group("0")
    reader.watch(watched, "DDP")
    marks: list[Any] = []
    for step in range(1, 7):
        for _ in range(6):
            ring.issue(watched)
        mark = reader.mark()
        assert mark is not None
        marks.append(mark)
        if step % 3 == 0:
            for m in marks:
                m.expand()
            marks.clear()
    assert reader.lost > 0 and reader.most_per_step == 6
    assert "set TORCH_FR_BUFFER_SIZE to at least 12" in capsys.readouterr().err
