"""One terminal, two writers: zeroscope's own lines never land inside the job's lines.

Headless, the job's output (relayed by :class:`~zeroscope.run.job_relay.OutputRelay` on its
reader threads) and zeroscope's own lines (the step lines, the summary: the main thread) go to
the same stdout, and on a terminal, or under ``2>&1``, stderr is that same file too. Written
independently, a step line landed at the end of a job's progress bar (``...\\r`` and no newline:
``grep '^step'`` then missed it) or between a job's text and its newline. So every write to
these streams goes through here, under one lock, and this module remembers, per open file
(stdout and stderr count as one when they are the same file), how the last write ended:

- on a newline: zeroscope's line goes as it is;
- on a carriage return (a progress bar, which redraws from column 0): zeroscope's line starts
  with a newline, so it has a line of its own and the bar stays readable above it;
- in the middle of a line (the job printed a prompt, or ``print()`` wrote its text and its
  newline in two writes): zeroscope's lines wait for the job's line to end, at most
  ``LINE_WAIT_S``; past that they start with a newline (a prompt may never end).

The relay passes the job's output on in whole lines (an unfinished one after a short pause,
``job_relay.PARTIAL_WAIT_S``), so a line of the job is never cut by another writer either.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from typing import IO, Any

LINE_WAIT_S = 3.0
"""How long zeroscope's lines wait for a job's unfinished line to end before they go anyway
(a job that prints a dot per step without a newline delays its step lines this long)."""

FRESH, RETURN, OPEN = "fresh", "return", "open"
"""Where the last write to a file left it: at a line start, after a carriage return, mid-line."""

_lock = threading.Lock()
_where: dict[object, str] = {}
_open_since: dict[object, float] = {}
_deferred: dict[object, list[tuple[IO[Any], str]]] = {}


def _key(stream: IO[Any]) -> object:
    """The open file behind ``stream``: stdout and stderr on one terminal (or ``2>&1``) share
    it."""
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return id(stream)
    return (st.st_dev, st.st_ino, st.st_rdev)


def job_output(sink: IO[bytes], data: bytes) -> None:
    """Write what the job printed (raises what the write raised: the relay stops showing)."""
    with _lock:
        key = _key(sink)
        sink.write(data)
        sink.flush()
        if not data:
            return
        end = data[-1:]
        where = FRESH if end == b"\n" else RETURN if end == b"\r" else OPEN
        if where == OPEN and _where.get(key) != OPEN:
            _open_since[key] = time.monotonic()
        _where[key] = where
        if where != OPEN and _deferred.get(key):
            _write_deferred(key)


def own_line(stream: IO[str], text: str, *, wait: bool = True) -> None:
    """Write one of zeroscope's lines on a line of its own (see the module docstring);
    ``wait=False`` once the job's output has ended (nothing will finish its line)."""
    with _lock:
        key = _key(stream)
        if wait and _where.get(key) == OPEN and time.monotonic() - _open_since[key] < LINE_WAIT_S:
            _deferred.setdefault(key, []).append((stream, text))
            return
        _write_deferred(key)  # the older lines first
        _write(key, stream, text)


def flush_due(force: bool = False) -> None:
    """Write the lines that waited ``LINE_WAIT_S`` for a job's line to end (all, ``force``)."""
    with _lock:
        now = time.monotonic()
        for key in [k for k, lines in _deferred.items() if lines]:
            if force or now - _open_since.get(key, 0.0) >= LINE_WAIT_S:
                _write_deferred(key)


def _write_deferred(key: object) -> None:
    lines = _deferred.pop(key, [])
    for stream, text in lines:
        with contextlib.suppress(OSError, ValueError):
            _write(key, stream, text)


def _write(key: object, stream: IO[str], text: str) -> None:
    lead = "" if _where.get(key, FRESH) == FRESH else "\n"
    stream.write(f"{lead}{text}\n")
    stream.flush()
    _where[key] = FRESH
