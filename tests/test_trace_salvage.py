"""Tier 1: a trace cut short or damaged still gives what is readable, and says what was lost;
a trace being written is whole in its own file within a checkpoint's interval."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from zeroscope.agent import schema
from zeroscope.agent.schema import StepReport
from zeroscope.store import trace as trace_mod
from zeroscope.store.trace import TraceReader, TraceWriter

PAGE = 4096


def big_report(rank: int, step: int) -> StepReport:
    # ~1 KB of label per report, so a trace of a few hundred steps spans many pages.
    return StepReport(rank=rank, step=step, wall_ns=step, duration_s=0.1, lr=step * 1e-3)


def write_closed(path: Path, steps: int) -> dict[int, bytes]:
    """A closed trace of ``steps`` x 2 ranks; returns seq -> payload as written (the answer)."""
    w = TraceWriter(path, job_id="job")
    for s in range(1, steps + 1):
        for r in range(2):
            m = big_report(r, s)
            w.append(m, schema.encode(m))
    w.close()
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT seq, payload FROM messages").fetchall())


def rows_of(reader: TraceReader) -> dict[int, bytes]:
    return dict(reader.raw())


def test_a_closed_trace_is_one_self_contained_file(tmp_path: Path) -> None:
    path = tmp_path / "t.zstrace"
    written = write_closed(path, 50)
    assert not Path(f"{path}-wal").exists() or Path(f"{path}-wal").stat().st_size == 0
    alone = tmp_path / "copy" / "t.zstrace"
    alone.parent.mkdir()
    shutil.copyfile(path, alone)  # the file alone, as a user copies it
    with TraceReader(alone) as r:
        assert r.damage is None and rows_of(r) == written


def test_a_copy_made_mid_run_holds_what_was_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Committed rows reach the trace file itself at each checkpoint, not only at close: a copy
    of the file alone, made while the writer is still open (or after it was killed), holds them.
    Before, they stayed in the -wal file until a reader opened the trace: the copy held none."""
    monkeypatch.setattr(trace_mod, "CHECKPOINT_INTERVAL", 0.0)
    path = tmp_path / "live.zstrace"
    w = TraceWriter(path, job_id="job", commit_interval=0.0)
    for s in range(1, 31):
        for r in range(2):
            m = big_report(r, s)
            w.append(m, schema.encode(m))
        w.commit()
    alone = tmp_path / "copy.zstrace"
    shutil.copyfile(path, alone)  # the writer is still open: the run goes on
    with TraceReader(alone) as r:
        assert r.steps() == (1, 30) and r.count("step") == 60
    w.close()


def test_a_truncated_copy_is_salvaged_up_to_the_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.zstrace"
    written = write_closed(path, 400)
    data = path.read_bytes()
    assert len(data) > 20 * PAGE
    cut = tmp_path / "cut.zstrace"
    cut.write_bytes(data[: (len(data) // PAGE // 2) * PAGE])  # a copy torn half-way
    with TraceReader(cut) as r:
        kept = rows_of(r)
        assert r.damage is not None and "everything after message" in r.damage
    # What was kept is exactly what was written, row for row, and a real share of it.
    assert kept and all(written[seq] == payload for seq, payload in kept.items())
    assert len(written) // 4 < len(kept) < len(written)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zeroscope: warning: ") and str(cut) in err


def test_a_damaged_page_in_the_middle_costs_only_its_rows(tmp_path: Path) -> None:
    """A trace whose writer never closed it (its process died) is checked page by page."""
    path = tmp_path / "t.zstrace"
    written = write_closed(path, 400)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value = '0' WHERE key = 'closed'")  # as a killed writer
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = bytearray(path.read_bytes())
    pages = len(data) // PAGE
    middle = pages // 2
    data[middle * PAGE : (middle + 1) * PAGE] = b"\xa5" * PAGE  # one page of bit rot
    bad = tmp_path / "bad.zstrace"
    bad.write_bytes(bytes(data))
    with TraceReader(bad) as r:
        kept = rows_of(r)
        assert r.damage is not None
    assert all(written[seq] == payload for seq, payload in kept.items())
    assert max(kept) == max(written)  # the rows after the bad page were read
    assert len(written) * 0.8 < len(kept) < len(written)
    assert not list(tmp_path.glob("*salvaged*"))  # the salvaged copy went with the reader


FULL_DISK_WRITER = """
import resource, sys
from zeroscope.agent import schema
from zeroscope.agent.schema import StepReport
from zeroscope.store import trace
trace.CHECKPOINT_INTERVAL = 0.0
limit = int(sys.argv[2])
w = trace.TraceWriter(sys.argv[1], commit_interval=0.0)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # every write past it: EFBIG
step = 0
try:
    while True:
        step += 1
        for rank in range(2):
            m = StepReport(rank=rank, step=step, wall_ns=step, duration_s=0.1, lr=step * 1e-3)
            w.append(m, schema.encode(m))
        w.commit()
        print(step, flush=True)
except Exception as exc:
    print("full:", type(exc).__name__, flush=True)
"""


def test_a_trace_filled_to_a_full_disk_reads_every_committed_step(tmp_path: Path) -> None:
    """A checkpoint that fails half-way on a full disk writes some pages (and page 1's size)
    into the file while the WAL still holds every committed row: the trace is read through the
    WAL, whole, not salvaged from the half-written file."""
    import os
    import subprocess
    import sys

    path = tmp_path / "full.zstrace"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run(
        [sys.executable, "-c", FULL_DISK_WRITER, str(path), str(48 * PAGE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out[-2] == "full:"
    committed = int(out[-3])
    assert committed > 10
    with TraceReader(path) as r:
        assert r.damage is None
        assert r.steps() is not None and r.steps()[1] >= committed  # type: ignore[index]
        assert r.count("step") >= 2 * committed


def test_replay_says_on_screen_that_the_trace_was_damaged(tmp_path: Path) -> None:
    """summary, export and headless replay said it (stderr); the TUI showed "no alerts" (a new
    user's trial with a trace cut in half). The note stays through a seek's rebuild."""
    import asyncio

    from tests.test_tui import screen_text
    from zeroscope.commands.replay import replay_state
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.feed import Batch, ReplayFeed

    path = tmp_path / "t.zstrace"
    write_closed(path, 400)
    data = path.read_bytes()
    cut = tmp_path / "cut.zstrace"
    cut.write_bytes(data[: (len(data) // PAGE // 2) * PAGE])

    async def look() -> tuple[str, str]:
        with TraceReader(cut) as reader:
            state = replay_state(reader)
            assert state.recording_error == reader.damage
            app = ZeroscopeApp(state, ReplayFeed(reader, start_step=5, paused=True))
            async with app.run_test(size=(120, 30)) as pilot:
                await pilot.pause(0.5)
                first = screen_text(app)
                app.apply_batch(Batch([], reset=True))  # what a seek does: state rebuilt
                assert app.state.recording_error == reader.damage
                app.state.version += 1
                await pilot.pause(0.5)
                return first, screen_text(app)

    for text in asyncio.run(look()):
        assert "is damaged" in text, text
