"""The collector writes and thins its trace on its own thread (zeroscope/store/background.py):
what it records live is thinned by the policy, and a write that fails stops the recording, said
once, while serving goes on."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.test_collector_snapshot import RANKS, run_job
from zeroscope.collector.server import Collector, wait_for
from zeroscope.store.background import BackgroundWriter
from zeroscope.store.thinning import ThinningPolicy
from zeroscope.store.trace import TraceReader


def test_a_live_big_job_is_recorded_thinned(tmp_path: Path) -> None:
    path = tmp_path / "live.zstrace"
    policy = ThinningPolicy(every=4, recent=3, from_ranks=RANKS)
    with Collector(record=path, thinning=policy) as col:
        assert isinstance(col.trace, BackgroundWriter)
        run_job(col, 30, event_at=11)
    with sqlite3.connect(path) as conn:
        steps = {s for (s,) in conn.execute("SELECT DISTINCT step FROM messages WHERE kind='step'")}
    # Step 1, every 4th, the Event's step 11, the last 3 (the reports' durations differ by
    # rank but steadily: no rank newly over the straggler limit after step 1).
    assert steps == {1, 4, 8, 11, 12, 16, 20, 24, 28, 29, 30}
    with TraceReader(path) as reader:
        assert reader.thinning == (policy, 28)
        assert len(reader.node_steps()) == 27  # one node: every rank's Hello says node 0


def test_a_failed_write_stops_recording_and_serving_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "full.zstrace"
    said: list[str] = []
    with Collector(record=path) as col:
        col.on_recording_stopped = said.append
        assert isinstance(col.trace, BackgroundWriter)

        def full(*_: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(col.trace.writer, "append_many", full)
        run_job(col, 3)
        assert wait_for(lambda: bool(col.recording_error), timeout=20)
        assert col.trace is None
        accepted = col.accepted
    assert said == [col.recording_error]
    assert "No space left on device" in col.recording_error
    assert accepted == RANKS * 4


def test_a_writer_that_falls_behind_holds_the_collector_not_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite stuck mid-write: the collector's appends queue up to MAX_PENDING rows, then wait
    for the writer (the sockets' high-water marks then push back on the senders), and every
    row reaches the trace in order once it moves again. Before, the queue grew without bound."""
    import threading

    from zeroscope.store import background

    monkeypatch.setattr(background, "MAX_PENDING", 3)
    stuck = threading.Event()
    written: list[int] = []

    class StuckWriter:
        path, job_id, last_step, commit_interval = tmp_path / "t", "", None, 30.0

        def append_many(self, rows: list[tuple[int, bytes]]) -> None:
            stuck.wait()
            written.extend(m for m, _ in rows)

        def commit(self) -> None: ...
        def close(self) -> None: ...
        def set_job_id(self, job_id: str) -> None: ...

    bw = BackgroundWriter(StuckWriter())  # type: ignore[arg-type]

    def _append(bw: BackgroundWriter, i: int, done: threading.Event) -> None:
        bw.append(i, b"")  # type: ignore[arg-type]
        done.set()

    for i in range(7):  # 3 queued, handed to the stuck writer; 3 more queued; the 7th waits
        done = threading.Event()
        t = threading.Thread(target=_append, args=(bw, i, done), daemon=True)
        t.start()
        if i < 6:
            assert done.wait(10.0), f"append {i} waited with room in the queue"
    assert not done.wait(0.5), "the 7th append went past a full queue"
    assert len(bw._rows) == 3
    stuck.set()
    assert done.wait(10.0)
    bw.close()
    assert written == list(range(7))
