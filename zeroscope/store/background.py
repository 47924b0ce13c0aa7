"""The collector's trace writer on its own thread, off the ingest path.

A trace commit at 16,384 ranks inserts ~16,000 rows a second, and thinning deletes as many
(store/thinning.py): ~20-35 us of CPU a report (bench/storage.py), most of it inside SQLite,
which lets go of the GIL while it works. Run on the collector's thread, every commit stalled
ingest; here the collector only appends (message, payload) to a list under a lock, and this
thread takes the list every ``commit_interval``, writes it, thins and checkpoints, while the
collector goes on reading sockets.

The list is bounded (:data:`MAX_PENDING` rows): when SQLite falls that far behind, the
collector's append waits for this thread to take the list, as it waited when it wrote itself,
and its sockets' high-water marks push back on the senders (their drops counted); the backlog
never grows the collector's memory without bound.

A write that fails (disk full, the file removed) is kept and raised by the collector's next
:meth:`maybe_commit`, which then stops recording as it did when it wrote itself.
"""

from __future__ import annotations

import threading
from pathlib import Path

from zeroscope.agent.schema import Message, NodeBatch
from zeroscope.store.trace import TraceWriter

MAX_PENDING = 50_000
"""Rows queued for the writer thread before an append waits (~100 MB of 2 KB reports; three
seconds of a 16,384-rank job at 1 step/s)."""


class BackgroundWriter:
    """A TraceWriter driven by its own thread; the collector's side of it is thread-safe."""

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self.path: Path = writer.path
        self.job_id = writer.job_id
        self.error: BaseException | None = None
        self._rows: list[tuple[Message, bytes] | tuple[NodeBatch, list[bytes]]] = []
        self._count = 0
        """Rows queued (a node batch's reports each count)."""
        self._lock = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._job_id_due = ""
        self._thread = threading.Thread(target=self._run, name="zeroscope-trace", daemon=True)
        self._thread.start()

    @property
    def last_step(self) -> int | None:
        return self.writer.last_step

    def set_job_id(self, job_id: str) -> None:
        self.job_id = self._job_id_due = job_id

    def append(self, message: Message, payload: bytes) -> None:
        with self._lock:
            self._wait_for_room()
            self._rows.append((message, payload))
            self._count += 1

    def append_batch(self, batch: NodeBatch, payloads: list[bytes]) -> None:
        """A node relay's batch of reports (TraceWriter.append_batch), in order with the rest."""
        with self._lock:
            self._wait_for_room()
            self._rows.append((batch, payloads))
            self._count += len(payloads)

    def _wait_for_room(self) -> None:
        while self._count >= MAX_PENDING and self._thread.is_alive():
            self._wake.set()  # write now, not at the next interval
            self._lock.wait(0.1)

    def maybe_commit(self) -> None:
        """Raise the writer thread's failure, if any (the collector then stops recording)."""
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        w = self.writer
        while True:
            self._wake.wait(w.commit_interval)
            self._wake.clear()
            stopping = self._stop.is_set()
            try:
                self._write()
                if stopping:
                    w.close()
                    return
            except BaseException as exc:
                self.error = exc
                with self._lock:
                    self._rows.clear()  # recording stops: an append must not wait on a dead thread
                    self._count = 0
                    self._lock.notify_all()
                try:
                    w.close()  # commits what it still can
                except Exception:
                    pass
                return

    def _write(self) -> None:
        with self._lock:
            rows, self._rows, self._count = self._rows, [], 0
            self._lock.notify_all()
        w = self.writer
        if self._job_id_due:
            w.set_job_id(self._job_id_due)
            self._job_id_due = ""
        run: list[tuple[Message, bytes]] = []
        for head, tail in rows:
            if isinstance(head, NodeBatch) and isinstance(tail, list):
                if run:
                    w.append_many(run)
                    run = []
                w.append_batch(head, tail)
            elif not isinstance(head, NodeBatch) and isinstance(tail, bytes):
                run.append((head, tail))
        if run:
            w.append_many(run)
        w.commit()

    def close(self) -> None:
        """Write what is queued, close the trace (folding its WAL in), and end the thread (a
        failure stays in ``error``: the collector has already said it, or is stopping)."""
        self._stop.set()
        self._wake.set()
        self._thread.join()
