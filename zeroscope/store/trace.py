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
so one fsync-free commit covers thousands of messages.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from zeroscope.agent import schema
from zeroscope.agent.schema import Message
from zeroscope.store.gc_pause import collector_paused
from zeroscope.store.salvage import cut_short, open_damaged, report_damage, salvage
from zeroscope.store.thinning import NODE_STEPS, StepBook, ThinningPolicy, thin, thinned_note

TRACE_FORMAT = "zeroscope-trace-1"

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


class TraceError(Exception):
    """A file that cannot be read or written as a trace; ``str()`` is one line naming it."""


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


def _connect(path: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
    except (sqlite3.Error, ValueError) as exc:  # ValueError: undecodable text in a damaged file
        raise TraceError(f"{path}: cannot open as a trace ({exc})") from None
    return conn


def _check_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        conn.execute("SELECT seq FROM messages LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        if "no such table" in str(exc):
            raise TraceError(f"{path}: not a zeroscope trace (no meta/messages table)") from None
        raise TraceError(f"{path}: corrupt or not a trace ({exc})") from None
    except ValueError as exc:  # e.g. bytes that are not UTF-8 where text was stored
        raise TraceError(f"{path}: corrupt trace ({type(exc).__name__})") from None
    if meta.get("format") != TRACE_FORMAT:
        raise TraceError(f"{path}: not a zeroscope trace (format {meta.get('format')!r})")
    version = meta.get("schema_version")
    if version != str(schema.SCHEMA_VERSION):
        raise TraceError(
            f"{path}: trace has wire schema_version {version}, "
            f"this zeroscope reads {schema.SCHEMA_VERSION}"
        )
    return meta


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
        self._conn = _connect(self.path)
        self._conn.execute("PRAGMA synchronous=NORMAL")
        # Thinning deletes most rows it wrote: SQLite builds that zero deleted content
        # (secure_delete on, as Debian's) made a delete cost 12.8 us a row against 4.5 without;
        # a deleted row's bytes stay in the file until its page is reused.
        self._conn.execute("PRAGMA secure_delete=OFF")
        self._conn.execute("PRAGMA cache_size=-65536")
        if existed:
            meta = _check_meta(self._conn, self.path)
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


class TraceReader:
    """Read a trace: indexed, seekable queries; never loads the whole file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise TraceError(f"{self.path} is a directory, not a trace file")
        if not self.path.is_file():
            raise TraceError(f"{self.path}: no such trace file")
        with open(self.path, "rb") as f:
            head = f.read(16)
        if head != b"SQLite format 3\x00":
            raise TraceError(f"{self.path}: not a zeroscope trace (not an SQLite file)")
        self.damage: str | None = None
        """What was lost, when the trace was damaged and is read from a salvaged copy."""
        if cut_short(self.path):  # SQLite would not even open it for reading
            probe = open_damaged(self.path)
            try:
                self.meta = _check_meta(probe, self.path)
            finally:
                probe.close()
            self._read_salvaged()
        else:
            self._conn = _connect(self.path)
            self.meta = _check_meta(self._conn, self.path)
            if self.meta.get("closed") != "1" and not self._intact():
                self._conn.close()
                self._read_salvaged()
        self._conn.execute("PRAGMA query_only=1")

    def _intact(self) -> bool:
        """SQLite's own page check, for a trace its writer never closed (a crash, a copy made
        mid-run, a full disk): one bad page there would fail every query that meets it. A
        closed trace is checked only for being cut short (a full read of a big trace on every
        open would cost seconds); damage inside it is refused in one line as before."""
        try:
            return [r[0] for r in self._conn.execute("PRAGMA quick_check").fetchall()] == ["ok"]
        except (sqlite3.DatabaseError, ValueError):
            return False

    def _read_salvaged(self) -> None:
        try:
            rescued = salvage(self.path, self.meta)
        except (sqlite3.Error, OSError) as exc:
            raise TraceError(f"{self.path}: damaged and not salvageable ({exc})") from None
        self.damage = rescued.note(self.path)
        self._copy = rescued.copy
        self._conn = _connect(rescued.copy)
        report_damage(self.damage)

    @property
    def job_id(self) -> str:
        return self.meta.get("job_id", "")

    @property
    def thinning(self) -> tuple[ThinningPolicy, int] | None:
        """(the policy, the first step kept in full) of a thinned trace; None when every
        message was kept."""
        policy, before = self.meta.get("thinning"), self.meta.get("thinned_before")
        if policy is None or before is None:
            return None
        return ThinningPolicy.from_json(policy), int(before)

    @property
    def thinned_note(self) -> str | None:
        """The sentence readers show for a thinned trace (None: not thinned)."""
        thinned = self.thinning
        return None if thinned is None else thinned_note(*thinned)

    def node_steps(
        self, from_step: int | None = None, to_step: int | None = None
    ) -> list[tuple[Any, ...]]:
        """Rows of the per-node aggregates of a thinned trace (store/thinning.py's columns),
        in (step, node) order; empty for a trace that was not thinned."""
        if self.thinning is None:
            return []
        lo = -(2**62) if from_step is None else from_step
        hi = 2**62 if to_step is None else to_step
        return self._fetch(
            "SELECT * FROM node_steps WHERE step BETWEEN ? AND ? ORDER BY step, node", (lo, hi)
        )

    def _fetch(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        """All rows of one query; a damaged file raises TraceError naming it."""
        try:
            return self._conn.execute(sql, args).fetchall()
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise TraceError(f"{self.path}: corrupt trace ({exc})") from None

    def steps(self, kind: str | None = None) -> tuple[int, int] | None:
        """(first, last) step recorded, or None when no step-bearing message exists; ``kind``
        (``"step"``): of that kind of message only. Without it the range holds the events and
        byes of the step a rank was in when it stopped (replay shows them), which no rank
        finished: a run whose ranks crashed in step 11 reported steps 1-10."""
        where = "step IS NOT NULL" + ("" if kind is None else " AND kind = ?")
        (row,) = self._fetch(
            f"SELECT MIN(step), MAX(step) FROM messages WHERE {where}",
            () if kind is None else (kind,),
        )
        return None if row[0] is None else (int(row[0]), int(row[1]))

    def count(self, kind: str | None = None) -> int:
        if kind is None:
            return int(self._fetch("SELECT COUNT(*) FROM messages")[0][0])
        return int(self._fetch("SELECT COUNT(*) FROM messages WHERE kind = ?", (kind,))[0][0])

    def hellos(self) -> list[schema.Hello]:
        """Each rank's Hello (the first one per rank), in rank order."""
        out: dict[int, schema.Hello] = {}
        for (payload,) in self._fetch(
            "SELECT payload FROM messages WHERE step IS NULL AND kind = 'hello' ORDER BY seq"
        ):
            msg = self._decode(payload)
            if isinstance(msg, schema.Hello) and msg.rank not in out:
                out[msg.rank] = msg
        return [out[r] for r in sorted(out)]

    def admissions(self) -> list[schema.Admission]:
        """The collector's records of senders it turned away (or admitted, never reporting),
        in arrival order: they name the ranks that never reported, with the reason. An older
        trace has none."""
        out = []
        for (payload,) in self._fetch(
            "SELECT payload FROM messages WHERE step IS NULL AND kind = 'admission' ORDER BY seq"
        ):
            msg = self._decode(payload)
            if isinstance(msg, schema.Admission):
                out.append(msg)
        return out

    def raw(
        self,
        from_step: int | None = None,
        to_step: int | None = None,
        ranks: Iterable[int] | None = None,
        kinds: Iterable[str] | None = None,
        *,
        batch: int = 4096,
    ) -> Iterator[tuple[int, bytes]]:
        """(seq, payload) of step-bearing messages in step order (then seq), filtered."""
        for rows in self._batches(from_step, to_step, ranks, kinds, batch):
            yield from rows

    def _batches(
        self,
        from_step: int | None,
        to_step: int | None,
        ranks: Iterable[int] | None,
        kinds: Iterable[str] | None,
        batch: int,
    ) -> Iterator[list[tuple[int, bytes]]]:
        where = ["step IS NOT NULL"]
        args: list[object] = []
        if from_step is not None:
            where.append("step >= ?")
            args.append(from_step)
        if to_step is not None:
            where.append("step <= ?")
            args.append(to_step)
        if ranks is not None:
            rs = list(ranks)
            where.append(f"rank IN ({','.join('?' * len(rs))})")
            args += rs
        if kinds is not None:
            ks = list(kinds)
            where.append(f"kind IN ({','.join('?' * len(ks))})")
            args += ks
        sql = f"SELECT seq, payload FROM messages WHERE {' AND '.join(where)} ORDER BY step, seq"
        try:
            cursor = self._conn.execute(sql, args)
            while rows := cursor.fetchmany(batch):
                yield rows
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise TraceError(f"{self.path}: corrupt trace ({exc})") from None

    def messages(
        self,
        from_step: int | None = None,
        to_step: int | None = None,
        ranks: Iterable[int] | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Iterator[Message]:
        """Decoded step-bearing messages (StepReport, Event, Heartbeat, Bye) in step order.

        Each batch is fetched and decoded with the garbage collector paused: the thousands of
        objects a batch makes all survive (the caller keeps them), so every collection they
        set off walked the whole heap for nothing; a replay seek at 16,384 ranks spent about
        40 % of its CPU there (docs/bench.md)."""
        batches = self._batches(from_step, to_step, ranks, kinds, 4096)
        while True:
            with collector_paused():
                rows = next(batches, None)
                if rows is None:
                    return
                decoded = [self._decode(payload) for _seq, payload in rows]
            yield from decoded

    def _decode(self, payload: bytes) -> Message:
        try:
            return schema.decode(payload)
        except schema.SchemaError as exc:
            raise TraceError(f"{self.path}: corrupt row ({exc})") from None

    def close(self) -> None:
        self._conn.close()
        copy = getattr(self, "_copy", None)
        if copy is not None:
            for leftover in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
                leftover.unlink(missing_ok=True)

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
