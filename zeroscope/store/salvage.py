"""What is still readable in a damaged trace: a copy cut short mid-run, a full disk, bit rot.

SQLite refuses a whole query ("database disk image is malformed") as soon as it meets one bad
page, so a trace copied while the job ran, or cut off by a full disk, could not be opened at all
although almost every row in it was intact. Salvage reads the ``messages`` table in ``seq``
order, row batch by row batch; where a batch hits a damaged page it probes forward (exponential
steps, then a binary search back) for the next readable row, so one bad page costs the rows on
it, not the file. Every row kept is a decodable wire message, written to a fresh trace in the
temporary folder, which :class:`~zeroscope.store.trace.TraceReader` then reads,
saying in one line what was lost.

Why not ``sqlite3 .recover``: the command-line shell is not always installed, and the standard
library does not expose it; the messages table's integer key makes the forward probe enough.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from zeroscope.agent import schema

_BATCH = 512
_PROBE_LIMIT = 1 << 40
"""Past any seq a trace can hold (a row per message, a million messages a second for a year)."""


@dataclass(frozen=True, slots=True)
class Salvage:
    """The salvaged copy and what it holds: rows kept, stretches skipped (seq ranges)."""

    copy: Path
    kept: int
    skipped: list[tuple[int, int]]
    """(first, last) seq of each unreadable stretch; an unreadable tail runs to the probe's
    limit."""
    undecodable: int
    first_step: int | None
    last_step: int | None

    def note(self, original: Path) -> str:
        """One line for the user: what was kept and what was lost."""
        steps = (
            f"steps {self.first_step}-{self.last_step}"
            if self.first_step is not None
            else "no step"
        )
        lost = []
        if self.skipped:
            tail = self.skipped[-1][1] >= _PROBE_LIMIT - 1
            stretches = len(self.skipped) - (1 if tail else 0)
            if stretches:
                lost.append(f"{stretches} unreadable stretch(es) of messages")
            if tail:
                lost.append(f"everything after message {self.skipped[-1][0] - 1}")
        if self.undecodable:
            lost.append(f"{self.undecodable} undecodable message(s)")
        return (
            f"{original} is damaged: read {self.kept} messages ({steps}) from a salvaged copy; "
            f"lost {', '.join(lost) or 'nothing readable'}"
        )


def _rows_from(conn: sqlite3.Connection, seq: int, limit: int) -> list[tuple[object, ...]] | None:
    """Up to ``limit`` rows from ``seq`` on, or None when the pages there are damaged."""
    try:
        return conn.execute(
            "SELECT seq, step, rank, kind, wall_ns, payload FROM messages"
            " WHERE seq >= ? ORDER BY seq LIMIT ?",
            (seq, limit),
        ).fetchall()
    except (sqlite3.DatabaseError, ValueError):
        return None


def _readable(conn: sqlite3.Connection, seq: int) -> bool:
    try:
        conn.execute("SELECT seq FROM messages WHERE seq >= ? LIMIT 1", (seq,)).fetchall()
        return True
    except (sqlite3.DatabaseError, ValueError):
        return False


def _next_readable(conn: sqlite3.Connection, bad: int) -> int:
    """The smallest seq after ``bad`` from which a query succeeds (``_PROBE_LIMIT`` if none):
    exponential steps forward, then a binary search back between the last failure and the
    first success."""
    step, lo = 1, bad
    while lo + step < _PROBE_LIMIT and not _readable(conn, lo + step):
        lo, step = lo + step, step * 2
    hi = min(lo + step, _PROBE_LIMIT)
    if hi >= _PROBE_LIMIT:
        return _PROBE_LIMIT
    while hi - lo > 1:  # lo unreadable, hi readable
        mid = (lo + hi) // 2
        if _readable(conn, mid):
            hi = mid
        else:
            lo = mid
    return hi


def salvage(path: Path, meta: dict[str, str]) -> Salvage:
    """Copy every readable, decodable row of ``path`` into a new trace with the same meta."""
    from zeroscope.store.trace import _CREATE

    src = open_damaged(path)
    fd, name = tempfile.mkstemp(prefix=f"{path.stem}.salvaged-", suffix=".zstrace")
    os.close(fd)
    copy = Path(name)
    dst = sqlite3.connect(copy, isolation_level=None)
    dst.executescript(_CREATE)
    dst.executemany("INSERT INTO meta(key, value) VALUES (?, ?)", sorted(meta.items()))
    kept = undecodable = 0
    skipped: list[tuple[int, int]] = []
    steps: list[int] = []
    seq = 0
    dst.execute("BEGIN")
    try:
        while seq < _PROBE_LIMIT:
            # A batch that meets a bad page fails whole: read on one row at a time up to it.
            rows = _rows_from(src, seq, _BATCH) or _rows_from(src, seq, 1)
            if rows is None:
                resume = _next_readable(src, seq)
                skipped.append((seq, resume - 1))
                seq = resume
                continue
            if not rows:
                break
            for row in rows:
                try:
                    schema.decode(row[5])
                except (schema.SchemaError, TypeError):
                    undecodable += 1
                    continue
                dst.execute(
                    "INSERT INTO messages(seq, step, rank, kind, wall_ns, payload)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    row,
                )
                kept += 1
                if isinstance(row[1], int):
                    steps.append(row[1])
            seq = int(rows[-1][0]) + 1  # type: ignore[call-overload]
        dst.execute("COMMIT")
    finally:
        src.close()
        dst.close()
    return Salvage(
        copy=copy,
        kept=kept,
        skipped=skipped,
        undecodable=undecodable,
        first_step=min(steps) if steps else None,
        last_step=max(steps) if steps else None,
    )


def report_damage(line: str) -> None:
    """Say once, on stderr, that a trace was read from a salvaged copy (the verbs' output on
    stdout stays what it is)."""
    print(f"zeroscope: warning: {line}", file=sys.stderr)


def open_damaged(path: Path) -> sqlite3.Connection:
    """A read-only connection to a trace that may be cut short. SQLite refuses a file shorter
    than its header's page count as corrupt, unless ``writable_schema`` is on (then it reads the
    pages that are there); nothing is written through it."""
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    conn.execute("PRAGMA writable_schema=ON")
    return conn


def cut_short(path: Path) -> bool:
    """Is the file shorter than its own header says (a copy torn mid-way, a full disk)? O(1):
    the page size and the page count SQLite keeps in the header, trusted only while the
    header's "version valid for" number matches its change counter, as SQLite itself does."""
    wal = Path(f"{path}-wal")
    if wal.exists() and wal.stat().st_size > 0:
        # A checkpoint that failed half-way (a full disk) has written page 1's new size but not
        # every page: the WAL still holds them all, and SQLite reads them from there.
        return False
    with open(path, "rb") as f:
        head = f.read(100)
    if len(head) < 100 or head[92:96] != head[24:28]:
        return False
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    return path.stat().st_size < page_size * int.from_bytes(head[28:32], "big")
