"""The trace reader decodes each batch with the garbage collector paused, and never leaves it
paused: not between the messages it yields, not after a corrupt row, not when the caller stops
early; and one that the caller paused stays paused."""

from __future__ import annotations

import gc
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_trace import report, write
from zeroscope.agent import schema
from zeroscope.store.trace import TraceError, TraceReader


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_decoding_pauses_the_collector_only_inside_a_batch(
    tmp_path: Path, collector_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.zst"
    write(path, 30)
    decoding: list[bool] = []
    decode = TraceReader._decode

    def watched(self: TraceReader, payload: bytes) -> schema.Message:
        decoding.append(gc.isenabled())
        return decode(self, payload)

    monkeypatch.setattr(TraceReader, "_decode", watched)
    between = []
    with TraceReader(path) as r:
        for _m in r.messages(kinds=["step"]):
            between.append(gc.isenabled())  # the caller's code between messages: collector on
        assert len(between) == 60 and all(between)
        assert len(decoding) == 60 and not any(decoding)
        assert [(m.step, m.rank) for m in r.messages(7, 8, kinds=["step"])] == [
            (7, 0),
            (7, 1),
            (8, 0),
            (8, 1),
        ]
        # A caller that stops early (a seek abandoned half-way) leaves it running too.
        it = r.messages()
        next(it)
        it.close()
        assert gc.isenabled()


def test_a_corrupt_row_restarts_the_collector(tmp_path: Path, collector_on: None) -> None:
    path = tmp_path / "t.zst"
    write(path, 3)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE messages SET payload = x'c1' WHERE step = 2 AND rank = 1")
    conn.commit()
    conn.close()
    with TraceReader(path) as r, pytest.raises(TraceError, match="corrupt row"):
        list(r.messages())
    assert gc.isenabled()


def test_a_collector_the_caller_paused_stays_paused(tmp_path: Path, collector_on: None) -> None:
    path = tmp_path / "t.zst"
    write(path, 2)
    gc.disable()
    try:
        with TraceReader(path) as r:
            msgs = list(r.messages(kinds=["step"]))
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert msgs[0] == report(0, 1) and schema.encode(msgs[-1]) == schema.encode(report(1, 2))
