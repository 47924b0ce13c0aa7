"""The job's output: all of it to the log file, and all the job's own lines to the terminal.

The job's stdout and stderr come to zeroscope through two pipes, read on two threads:

- every byte goes to the log (``runs/JOB.log`` beside the trace), unchanged and flushed as it
  comes, so ``tail -f`` follows it and nothing the job printed is lost;
- headless, stdout is passed to zeroscope's stdout in whole lines (a progress bar's ``\r``
  ends one; an unfinished line goes as it is after ``PARTIAL_WAIT_S``), and stderr line by line,
  the ranks' tracebacks included, minus torchrun's shutdown chatter
  (:class:`~zeroscope.run.job_errors.ErrorScanner`, which also reads each rank's error line: the
  end of the run prints the first failing rank's once). Both go through
  :mod:`zeroscope.run.console`, which keeps zeroscope's own lines out of the job's lines;
- under the TUI nothing is forwarded (the TUI owns the terminal) but the errors are still read,
  so the view can show the first one as soon as it appears.

A terminal that goes away (``| head``) stops the forwarding, never the job: the relay keeps
reading, so the ranks never block on a full pipe or die of SIGPIPE because of zeroscope.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from typing import BinaryIO

from zeroscope.run import console
from zeroscope.run.job_errors import ErrorScanner

MAX_PENDING = 1 << 20
"""Bytes of one unfinished line held back before it is passed on as it is."""
PARTIAL_WAIT_S = 0.1
"""How long an unfinished line waits for the rest before it is shown as it is (a prompt, or a
bar redrawn without ``\r``)."""


class OutputRelay:
    """Reads the job's two pipes until end-of-file (see the module docstring)."""

    def __init__(
        self,
        stdout_fd: int,
        stderr_fd: int,
        *,
        log: str | None,
        forward: bool,
        scanner: ErrorScanner,
        out: BinaryIO | None = None,
        err: BinaryIO | None = None,
    ) -> None:
        self.scanner = scanner
        self.forward = forward
        self._gone: set[int] = set()
        """Sinks whose reader went away."""
        self._log = open(log, "ab") if log else None  # noqa: SIM115 (closed by the last reader)
        self._log_lock = threading.Lock()
        self._open = 2
        self._threads = [
            threading.Thread(
                target=self._copy, args=(stdout_fd, out, False), name="zeroscope-job-stdout"
            ),
            threading.Thread(
                target=self._copy, args=(stderr_fd, err, True), name="zeroscope-job-stderr"
            ),
        ]
        for t in self._threads:
            t.daemon = True
            t.start()

    def join(self, timeout: float) -> bool:
        """Wait for both pipes' end (a background process the job left behind may hold them
        open for ever: hence the timeout). True when everything was read."""
        for t in self._threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def _write_log(self, data: bytes) -> None:
        if self._log is None:
            return
        with self._log_lock, contextlib.suppress(OSError, ValueError):
            self._log.write(data)
            self._log.flush()

    def _copy(self, fd: int, sink: BinaryIO | None, scan: bool) -> None:
        pending = b""
        try:
            while True:
                if pending and not select.select([fd], [], [], PARTIAL_WAIT_S)[0]:
                    # An unfinished line and nothing more for a moment: a prompt or a bar.
                    self._send(sink, pending, scan)
                    pending = b""
                try:
                    data = os.read(fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    break
                self._write_log(data)
                pending += data
                cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
                if not cut and len(pending) > MAX_PENDING:
                    cut = len(pending)  # a line without end: show it in pieces
                if not scan:
                    if cut:
                        self._emit(sink, pending[:cut])  # whole lines, in one write
                else:
                    for segment in pending[:cut].splitlines(keepends=True):
                        self._send(sink, segment, scan)
                pending = pending[cut:]
            if pending:
                self._send(sink, pending, scan)
        finally:
            with contextlib.suppress(OSError):
                os.close(fd)
            with self._log_lock:
                self._open -= 1
                if self._open == 0 and self._log is not None:
                    self._log.close()

    def _send(self, sink: BinaryIO | None, segment: bytes, scan: bool) -> None:
        line = segment.rstrip(b"\r\n").decode("utf-8", "replace")
        show = self.scanner.feed(line) if scan else True
        if show:
            self._emit(sink, segment)

    def _emit(self, sink: BinaryIO | None, data: bytes) -> None:
        if not self.forward or sink is None or id(sink) in self._gone:
            return
        try:
            console.job_output(sink, data)
        except (OSError, ValueError):
            self._gone.add(id(sink))  # the reader went away (| head): keep reading, stop showing
