"""Tier 1: replay through TraceSource: Hellos first, then one step per poll, seek, and the
queries replay needs to rebuild state after a seek."""

from __future__ import annotations

from pathlib import Path

from zeroscope.agent.schema import Event, Hello, StepReport
from zeroscope.store.sources import TraceSource

from .test_trace import write


def test_replay_step_by_step_and_seek(tmp_path: Path) -> None:
    path = tmp_path / "t.zst"
    write(path, 12)  # 2 ranks, steps 1..12, an overflow Event every 5 steps
    src = TraceSource(path)
    assert (src.first_step, src.last_step) == (1, 12)
    first = src.poll(0)
    assert [type(m) for m in first] == [Hello, Hello]
    step1 = src.poll(0)
    assert [(m.step, m.rank) for m in step1] == [(1, 0), (1, 1)]
    src.seek(5)
    step5 = src.poll(0)
    assert [type(m) for m in step5] == [StepReport, StepReport, Event]
    assert {m.step for m in step5} == {5}
    assert src.step_messages(10)[-1] == Event(rank=0, step=10, wall_ns=0, event="overflow")
    until = list(src.messages_until(3))
    assert [type(m) for m in until[:2]] == [Hello, Hello]
    assert [m.step for m in until[2:]] == [1, 1, 2, 2, 3, 3]
    src.seek(12)
    assert len(src.poll(0)) == 2
    assert src.at_end and src.poll(0) == []
    src.seek(-5)  # clamped to the first step
    assert src.poll(0)[0].step == 1
    src.close()


def test_empty_trace_replays_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.zst"
    write(path, 0)
    src = TraceSource(path)
    assert [type(m) for m in src.poll(0)] == [Hello, Hello]
    assert src.at_end and src.poll(0) == []
