"""Tier 1: the SQLite trace store: round trip, indexed seeks, crash safety, bad files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zeroscope.agent import schema
from zeroscope.agent.schema import Event, Hello, MemoryBytes, StepReport
from zeroscope.store.trace import TraceError, TraceReader, TraceWriter


def hello(rank: int) -> Hello:
    return Hello(schema_version=schema.SCHEMA_VERSION, job_id="job", rank=rank, world_size=2)


def report(rank: int, step: int) -> StepReport:
    return StepReport(
        rank=rank, step=step, wall_ns=step, duration_s=0.1, memory=MemoryBytes(params=step)
    )


def write(path: Path, steps: int, ranks: int = 2) -> None:
    w = TraceWriter(path, job_id="job")
    for r in range(ranks):
        w.append(hello(r), schema.encode(hello(r)))
    for s in range(1, steps + 1):
        for r in range(ranks):
            m = report(r, s)
            w.append(m, schema.encode(m))
        if s % 5 == 0:
            e = Event(rank=0, step=s, wall_ns=0, event="overflow")
            w.append(e, schema.encode(e))
    w.close()


def test_round_trip_and_queries(tmp_path: Path) -> None:
    path = tmp_path / "t.zst"
    write(path, 20)
    with TraceReader(path) as r:
        assert r.job_id == "job"
        assert r.steps() == (1, 20)
        assert [h.rank for h in r.hellos()] == [0, 1]
        assert r.count() == 2 + 40 + 4
        assert r.count("step") == 40
        msgs = list(r.messages(from_step=7, to_step=9, ranks=[1], kinds=["step"]))
        assert [(m.step, m.rank) for m in msgs] == [(7, 1), (8, 1), (9, 1)]
        assert msgs[0] == report(1, 7)
        events = list(r.messages(kinds=["event"]))
        assert [e.step for e in events] == [5, 10, 15, 20]
        steps = [m.step for m in r.messages()]
        assert steps == sorted(steps)


def test_seek_uses_the_index(tmp_path: Path) -> None:
    path = tmp_path / "t.zst"
    write(path, 3)
    conn = sqlite3.connect(path)
    plan = " ".join(
        str(row)
        for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT seq, payload FROM messages "
            "WHERE step IS NOT NULL AND step >= 2 AND step <= 2 ORDER BY step, seq"
        )
    )
    assert "messages_step_rank_kind" in plan


def test_writer_continues_an_existing_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.zst"
    write(path, 2)
    w = TraceWriter(path)
    m = report(0, 3)
    w.append(m, schema.encode(m))
    w.close()
    with TraceReader(path) as r:
        assert r.steps() == (1, 3) and r.job_id == "job"


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 100)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE x(a)").connection.commit()
    wrong_version = tmp_path / "v.zst"
    write(wrong_version, 1)
    with sqlite3.connect(wrong_version) as c:
        c.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    corrupt = tmp_path / "corrupt.zst"
    write(corrupt, 50)
    data = bytearray(corrupt.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)
    corrupt.write_bytes(bytes(data))
    for path, words in [
        (tmp_path / "missing.zst", "no such trace"),
        (text, "not a zeroscope trace"),
        (other, "not a zeroscope trace"),
        (wrong_version, "schema_version 999"),
        (corrupt, str(corrupt)),
    ]:
        with pytest.raises(TraceError) as info:
            r = TraceReader(path)
            list(r.messages())
        assert words in str(info.value)
        assert "\n" not in str(info.value)


WRITER = """
import sys, time
from zeroscope.agent import schema
from zeroscope.agent.schema import StepReport
from zeroscope.store.trace import TraceWriter
w = TraceWriter(sys.argv[1], commit_interval=0.0)
step = 0
while True:
    step += 1
    for rank in range(2):
        m = StepReport(rank=rank, step=step, wall_ns=0, duration_s=0.0)
        w.append(m, schema.encode(m))
    w.commit()
    print(step, flush=True)
    time.sleep(0.002)
"""


def test_trace_of_a_killed_writer_replays_to_its_last_committed_step(tmp_path: Path) -> None:
    path = tmp_path / "killed.zst"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    committed = 0
    deadline = time.monotonic() + 30
    while committed < 30 and time.monotonic() < deadline:
        committed = int(proc.stdout.readline())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert committed >= 30
    assert (tmp_path / "killed.zst-wal").exists()  # the crash left an un-checkpointed WAL
    with TraceReader(path) as r:
        first, last = r.steps() or (0, 0)
        assert first == 1 and last >= committed
        per_step = {}
        for m in r.messages(to_step=committed):
            per_step[m.step] = per_step.get(m.step, 0) + 1
        assert per_step == {s: 2 for s in range(1, committed + 1)}


def test_a_hello_said_again_is_the_one_read_and_the_config_follows_its_rank(tmp_path: Path) -> None:
    """A rank says its Hello again once it knows more (a loop's second optimizer, learned at
    its second step): replay reads each rank's newest, and the view's config follows the
    rank whose Hello gave it, not another rank's later one. Before, the first was kept."""
    from zeroscope.agent.schema import ConfigSummary
    from zeroscope.state import ClusterState

    def said(rank: int, optimizer: str) -> Hello:
        return Hello(
            schema_version=schema.SCHEMA_VERSION,
            job_id="job",
            rank=rank,
            world_size=2,
            config=ConfigSummary(stage=0, precision="fp32", dp_world_size=2, optimizer=optimizer),
        )

    path = tmp_path / "t.zst"
    w = TraceWriter(path, job_id="job")
    for m in (said(0, "SGD"), said(1, "SGD"), said(0, "SGD+AdamW"), said(1, "SGD+AdamW")):
        w.append(m, schema.encode(m))
    w.close()
    with TraceReader(path) as r:
        assert [h.config.optimizer for h in r.hellos()] == ["SGD+AdamW"] * 2
    live = ClusterState()
    live.ingest_all([said(0, "SGD"), said(1, "SGD"), said(0, "SGD+AdamW")])
    assert live.config is not None and live.config.optimizer == "SGD+AdamW"
    live.ingest(said(1, "Adam"))  # another rank's word does not replace the first rank's
    assert live.config.optimizer == "SGD+AdamW"
