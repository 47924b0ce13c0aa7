"""A trace file as both its writer and its reader open it: the format tag, the one error type
(its ``str()`` one line naming the file), the connection and the check of the meta table.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from zeroscope.agent import schema

TRACE_FORMAT = "zeroscope-trace-1"


class TraceError(Exception):
    """A file that cannot be read or written as a trace; ``str()`` is one line naming it."""


def connect(path: Path) -> sqlite3.Connection:
    """The file opened in WAL mode, or TraceError naming it."""
    try:
        conn = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
    except (sqlite3.Error, ValueError) as exc:  # ValueError: undecodable text in a damaged file
        raise TraceError(f"{path}: cannot open as a trace ({exc})") from None
    return conn


def check_meta(conn: sqlite3.Connection, path: Path) -> dict[str, str]:
    """The meta table, once it says this is a trace of this zeroscope's format and schema."""
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
