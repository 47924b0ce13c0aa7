"""Reading a trace: its Hellos, admissions and messages in (step, rank) order, in batches
decoded with the garbage collector paused; a damaged file is read from a salvaged copy
(store/salvage.py), and a thinned one says so (store/thinning.py).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from zeroscope.agent import schema
from zeroscope.agent.schema import Message
from zeroscope.state.ending import JobEnd
from zeroscope.state.ending import decode as decode_end
from zeroscope.store.gc_pause import collector_paused
from zeroscope.store.salvage import cut_short, open_damaged, report_damage, salvage
from zeroscope.store.thinning import ThinningPolicy, thinned_note
from zeroscope.store.trace_file import TraceError, check_meta, connect


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
                self.meta = check_meta(probe, self.path)
            finally:
                probe.close()
            self._read_salvaged()
        else:
            self._conn = connect(self.path)
            self.meta = check_meta(self._conn, self.path)
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
        self._conn = connect(rescued.copy)
        report_damage(self.damage)

    @property
    def job_id(self) -> str:
        return self.meta.get("job_id", "")

    @property
    def job_end(self) -> JobEnd | None:
        """How the launcher saw the job end (``zeroscope run`` keeps it as it finishes);
        None for a trace without it."""
        return decode_end(self.meta.get("job_end"))

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
        """Each rank's newest Hello, in rank order: a rank says its Hello again when what it
        runs became known later (a loop's optimizers, learned from its second step on), and
        after a reconnection (the same again)."""
        out: dict[int, schema.Hello] = {}
        for (payload,) in self._fetch(
            "SELECT payload FROM messages WHERE step IS NULL AND kind = 'hello' ORDER BY seq"
        ):
            msg = self._decode(payload)
            if isinstance(msg, schema.Hello):
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
