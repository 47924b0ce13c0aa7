"""The trace store: every accepted message of a job in one SQLite file (stdlib ``sqlite3``).

Why SQLite: crash-safe (WAL: a writer killed mid-run leaves every committed transaction
readable), seekable for replay through an index on (step, rank, kind) without loading the file,
and queryable by users with any SQLite tool. Each row keeps the message's msgpack bytes (the
wire encoding, no pickle) plus the indexed columns::

    messages(seq INTEGER PRIMARY KEY, step, rank, kind, wall_ns, payload BLOB)
    meta(key TEXT PRIMARY KEY, value TEXT)   -- format, schema_version, job_id, created

A big job's trace is thinned beyond its recent steps (store/thinning.py: the policy, the
``node_steps`` table of per-node aggregates, and the ``thinning`` / ``thinned_before`` meta
keys every reader reports).

The writer batches rows and commits every ``commit_interval`` seconds or ``commit_rows`` rows,
so one fsync-free commit covers thousands of messages. The reader is store/trace_reader.py and
what both open a file with store/trace_file.py; this module re-exports their names.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

from zeroscope.agent import schema
from zeroscope.agent.schema import Message
from zeroscope.store.thinning import NODE_STEPS, StepBook, ThinningPolicy, thin
from zeroscope.store.trace_file import TRACE_FORMAT as TRACE_FORMAT
from zeroscope.store.trace_file import TraceError as TraceError
from zeroscope.store.trace_file import check_meta, connect
from zeroscope.store.trace_reader import TraceReader as TraceReader

CHECKPOINT_INTERVAL = 2.0
"""Seconds between the writer's WAL checkpoints: the trace file alone lags the committed rows
by at most about this much (a checkpoint of a few MB costs a few ms on the collector's
thread)."""


_CREATE = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages(
    seq INTEGER PRIMARY KEY,
    step INTEGER,
    rank INTEGER,
    kind TEXT NOT NULL,
    wall_ns INTEGER,
    payload BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_step_rank_kind ON messages(step, rank, kind);
"""


def row_of(message: Message) -> tuple[int | None, int | None, str, int]:
    """The indexed columns of one message: (step, rank, kind, wall_ns). A Hello has no step;
    neither has the collector's Admission record (read with the Hellos, before the steps), whose
    rank is a claim (NULL when it names none)."""
    if isinstance(message, schema.Hello):
        return None, message.rank, "hello", message.started_ns
    if isinstance(message, schema.Admission):
        rank = message.rank if message.rank >= 0 else None
        return None, rank, "admission", message.wall_ns
    return message.step, message.rank, str(type(message).__struct_config__.tag), message.wall_ns


def record_job_end(path: str | Path, job_end: str) -> None:
    """Keep how the job ended (zeroscope.state.ending, JSON) in a trace its writer has closed:
    one meta row. Best effort: a trace that cannot take it (a full disk, a file gone) keeps
    everything it recorded and reads as before."""
    try:
        conn = sqlite3.connect(str(path), timeout=5.0)
        try:
            with conn:
                conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('job_end', ?)", (job_end,)
                )
        finally:
            conn.close()
    except sqlite3.Error:
        pass


class TraceWriter:
    """Append messages to a trace file (created if absent; an existing trace is continued).

    Not thread-safe: one writer thread (the collector's) owns it.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        job_id: str = "",
        commit_interval: float = 0.2,
        commit_rows: int = 20_000,
        thinning: ThinningPolicy | None = None,
    ) -> None:
        """``thinning``: the policy for a big job's history (None: keep everything)."""
        self.path = Path(path)
        existed = self.path.exists() and self.path.stat().st_size > 0
        self._conn = connect(self.path)
        self._conn.execute("PRAGMA synchronous=NORMAL")
        # Thinning deletes most rows it wrote: SQLite builds that zero deleted content
        # (secure_delete on, as Debian's) made a delete cost 12.8 us a row against 4.5 without;
        # a deleted row's bytes stay in the file until its page is reused.
        self._conn.execute("PRAGMA secure_delete=OFF")
        self._conn.execute("PRAGMA cache_size=-65536")
        if existed:
            meta = check_meta(self._conn, self.path)
            self.job_id = meta.get("job_id", "")
        else:
            try:
                self._conn.executescript(_CREATE)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                    [
                        ("format", TRACE_FORMAT),
                        ("schema_version", str(schema.SCHEMA_VERSION)),
                        ("job_id", job_id),
                        ("created", str(time.time_ns())),
                    ],
                )
            except sqlite3.Error as exc:
                raise TraceError(f"{self.path}: cannot create trace ({exc})") from None
            self.job_id = job_id
        self._mark_closed("0")
        self._pending: list[tuple[int | None, int | None, str, int, bytes]] = []
        self._last_commit = time.monotonic()
        self._last_checkpoint = self._last_commit
        self.commit_interval = commit_interval
        self.commit_rows = commit_rows
        self.rows = 0
        self.last_step: int | None = None
        """Highest step committed so far (what a reader is sure to find)."""
        self.book = StepBook(thinning) if thinning is not None else None
        """What thinning needs of the steps still in the recent window."""
        self._thinning_noted = False

    def set_job_id(self, job_id: str) -> None:
        """Record the job id (learned from the first Hello)."""
        if job_id and job_id != self.job_id:
            self.job_id = job_id
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('job_id', ?)", (job_id,)
            )

    def append(self, message: Message, payload: bytes) -> None:
        """Queue one message (its wire bytes); commits when a batch is due."""
        if self.book is not None and not self.book.note(message):
            return
        self._pending.append((*row_of(message), payload))
        if (
            len(self._pending) >= self.commit_rows
            or time.monotonic() - self._last_commit >= self.commit_interval
        ):
            self.commit()

    def append_many(self, rows: Iterable[tuple[Message, bytes]]) -> None:
        book = self.book
        for message, payload in rows:
            if book is not None and not book.note(message):
                continue
            self._pending.append((*row_of(message), payload))
        self.maybe_commit()

    def append_batch(self, batch: schema.NodeBatch, payloads: list[bytes]) -> None:
        """A node relay's StepReports (agent/node_batch.py), written from the batch's header
        without decoding them: the same rows their messages would make, and the node
        aggregates the header carries for thinning's ``node_steps``."""
        entries = batch.entries
        book = self.book
        keep = book.note_batch(entries, batch.nodes) if book is not None else None
        pending = self._pending
        for i, (e, payload) in enumerate(zip(entries, payloads, strict=True)):
            if keep is None or keep[i]:
                pending.append((e.step, e.rank, "step", e.wall_ns, payload))
        self.maybe_commit()

    def maybe_commit(self) -> None:
        """Commit if the batch is due (call periodically even when idle)."""
        if self._pending and (
            len(self._pending) >= self.commit_rows
            or time.monotonic() - self._last_commit >= self.commit_interval
        ):
            self.commit()

    def commit(self) -> None:
        """Write every queued row in one transaction."""
        self._last_commit = time.monotonic()
        if not self._pending:
            return
        rows, self._pending = self._pending, []
        conn = self._conn
        conn.execute("BEGIN")
        try:
            conn.executemany(
                "INSERT INTO messages(step, rank, kind, wall_ns, payload) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if self.book is not None and self.book.active:
            self._thin()
        if self._last_commit - self._last_checkpoint >= CHECKPOINT_INTERVAL:
            self._checkpoint("PASSIVE")
        self.rows += len(rows)
        steps = [row[0] for row in rows if row[0] is not None]
        if steps:
            self.last_step = max(max(steps), self.last_step or 0)

    def _thin(self) -> None:
        """Thin the steps that left the recent window (store/thinning.py), in one transaction
        with the meta keys that say so."""
        book = self.book
        assert book is not None
        if not book.due():
            return
        conn = self._conn
        if not self._thinning_noted:
            conn.execute(NODE_STEPS)
        conn.execute("BEGIN")
        try:
            if not self._thinning_noted:
                conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('thinning', ?)",
                    (book.policy.to_json(),),
                )
            thin(conn, book)
            conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('thinned_before', ?)",
                (str(book.thinned_before),),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self._thinning_noted = True

    def _checkpoint(self, mode: str) -> None:
        """Copy the WAL into the trace file itself. Until a checkpoint, committed rows live in
        the ``-wal`` file beside it: a user who copies only the ``.zstrace`` after a ``kill -9``
        (or while the job runs) would get its first page and nothing else."""
        self._last_checkpoint = time.monotonic()
        try:
            self._conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
        except sqlite3.Error:
            pass  # a busy reader or a full disk: the rows stay safe in the WAL

    def _mark_closed(self, value: str) -> None:
        try:
            self._conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('closed', ?)", (value,)
            )
        except sqlite3.Error:
            pass  # a full disk: the trace is then read as not closed, and checked

    def close(self) -> None:
        """Commit, mark the trace closed and fold the WAL into it: the file alone is the
        whole trace after the run ends or is stopped."""
        try:
            self.commit()
            while self.book is not None and self.book.active and self.book.due():
                self._thin()
            self._mark_closed("1")
            self._checkpoint("TRUNCATE")
        finally:
            self._conn.close()
