"""Discovery records: how ``zeroscope jobs`` (and, over SSH, ``zeroscope attach``) finds the
collectors running on this machine.

Each collector (``zeroscope serve`` or ``zeroscope run``) writes one small JSON file while it
runs: job id, ports, token, pid, start time, trace path, host. The token in it is a secret, so
the folder is private to the user (0700) and each file is 0600, written atomically (a reader
never sees half a record). No pickle: the record is a msgspec Struct encoded as JSON.

Where: ``$ZEROSCOPE_HOME/jobs`` when set (tests); otherwise ``$XDG_RUNTIME_DIR/zeroscope``
(a per-user tmpfs that vanishes at logout) or ``~/.cache/zeroscope/jobs``. Listing reads every
candidate folder, because a job started by a scheduler often lacks ``XDG_RUNTIME_DIR`` while
the user's SSH session has it.

A record whose process is gone is stale: it is pruned, unless its trace file exists, in which
case it is kept (for :data:`FINISHED_TTL_S`) as a *finished* job so ``attach`` can say "this
job finished; replay its trace" instead of "no such job". A home folder shared over NFS by
many nodes holds other hosts' records too; those are never judged (a pid means nothing on
another host) and never listed.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Literal

import msgspec
import psutil

FINISHED_TTL_S = 7 * 24 * 3600
"""How long the record of a finished job (one with a trace) is kept for ``attach``'s hint."""

JobKind = Literal["serve", "run"]
JobState = Literal["running", "finished"]


class JobRecord(msgspec.Struct, kw_only=True):
    """What a viewer needs to reach one collector (and to know whether it still runs)."""

    job_id: str
    host: str
    pid: int
    pid_started: float
    """The process's creation time (psutil, wall clock), so a recycled pid is not mistaken for
    the job where its start in ticks (``pid_ticks``) cannot be read."""
    pid_ticks: int | None = None
    """The process's start in clock ticks since boot (Linux ``/proc/PID/stat``): the identity
    check where it exists. The wall-clock creation time is boot time plus these ticks, and the
    kernel's boot time moves whenever the wall clock is stepped (a VM resumed, NTP's step; read
    in whole seconds, even a small step can move it by one): a running job's record then read
    as a finished one."""
    started_ns: int
    bind_host: str = "127.0.0.1"
    ingest_port: int
    viewer_port: int
    """The collector's ROUTER (snapshots, catch-up), on the host's loopback."""
    pub_port: int | None = None
    """The collector's PUB (live updates), on the host's loopback; tunnelled beside viewer_port."""
    token: str
    """The per-job secret senders must present (hex); see docs/remote.md."""
    trace: str | None = None
    kind: JobKind = "serve"
    command: list[str] = []
    nnodes: int = 1
    ended_ns: int | None = None
    state: JobState = "running"
    """Filled in by :func:`list_jobs` from the process table; not trusted from disk."""

    @classmethod
    def here(
        cls,
        *,
        job_id: str,
        ingest_address: str,
        viewer_address: str,
        token: str,
        pub_address: str | None = None,
        trace: str | os.PathLike[str] | None = None,
        kind: JobKind = "serve",
        command: list[str] | None = None,
        nnodes: int = 1,
    ) -> JobRecord:
        """A record for a collector running in *this* process, from its ZeroMQ addresses
        (``tcp://HOST:PORT``)."""
        bind_host, ingest_port = split_address(ingest_address)
        _, viewer_port = split_address(viewer_address)
        me = psutil.Process()
        return cls(
            job_id=job_id,
            host=socket.gethostname(),
            pid=me.pid,
            pid_started=me.create_time(),
            pid_ticks=start_ticks(me.pid),
            started_ns=time.time_ns(),
            bind_host=bind_host,
            ingest_port=ingest_port,
            viewer_port=viewer_port,
            pub_port=split_address(pub_address)[1] if pub_address else None,
            token=token,
            trace=None if trace is None else str(Path(trace).resolve()),
            kind=kind,
            command=list(command or []),
            nnodes=nnodes,
        )


class JobHandle(msgspec.Struct):
    """Returned by :func:`register`; give it back to :func:`unregister`."""

    record: JobRecord
    path: str


def split_address(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` -> (HOST, PORT); ValueError naming the address otherwise."""
    rest = address.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not a tcp://HOST:PORT address: {address!r}")
    return host.strip("[]"), int(port)


def new_job_id() -> str:
    """Short, typeable, unique enough per machine: ``YYYYmmdd-HHMMSS-xxxx``."""
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def new_token() -> str:
    """A fresh per-job secret (128 bits, hex)."""
    return secrets.token_hex(16)


def job_dirs() -> list[Path]:
    """Candidate record folders, the one :func:`register` writes to first."""
    home = os.environ.get("ZEROSCOPE_HOME")
    if home:
        return [Path(home) / "jobs"]
    dirs = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        dirs.append(Path(runtime) / "zeroscope")
    dirs.append(Path.home() / ".cache" / "zeroscope" / "jobs")
    return dirs


def private_dir(path: Path) -> Path:
    """Create ``path`` as 0700 (or tighten it); refuse one owned by somebody else."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to another user; refusing to keep secrets there")
    if stat.S_IMODE(st.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically with mode 0600 (created so, never widened)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_private(path: Path) -> None:
    """Create an empty file 0600 (FileExistsError if it exists). Used for traces before SQLite
    opens them: SQLite gives its journal files the database file's mode, so all stay private."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def register(record: JobRecord) -> JobHandle:
    """Publish ``record`` for ``zeroscope jobs``; returns the handle for :func:`unregister`.

    Tries each candidate folder in turn (a stale ``XDG_RUNTIME_DIR`` may point nowhere). When
    none is writable the job still runs, unlisted: a warning, and a handle that unregisters
    nothing (being findable is a convenience; it must never stop a training job)."""
    problem = ""
    for folder in job_dirs():
        try:
            path = private_dir(folder) / f"{record.job_id}.json"
            write_private(path, msgspec.json.encode(record))
            return JobHandle(record=record, path=str(path))
        except OSError as exc:
            problem = f"{folder}: {exc.strerror or exc}"
    print(
        f"zeroscope: warning: job not listed for zeroscope jobs/attach ({problem})", file=sys.stderr
    )
    return JobHandle(record=record, path="")


def unregister(handle: JobHandle) -> None:
    """The collector is stopping. A job with a trace on disk stays listed as finished (so a
    late ``attach`` can offer its replay); any other record is removed."""
    if not handle.path:
        return
    path = Path(handle.path)
    trace = handle.record.trace
    if trace and Path(trace).exists():
        done = msgspec.structs.replace(handle.record, ended_ns=time.time_ns(), state="finished")
        try:
            write_private(path, msgspec.json.encode(done))
        except OSError:
            path.unlink(missing_ok=True)
    else:
        path.unlink(missing_ok=True)


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (field 22 of Linux's
    ``/proc/PID/stat``; None where there is no such file). Unlike a wall-clock creation time it
    never moves while the process lives."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: split after its end
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def is_running(record: JobRecord) -> bool:
    """The record's process is alive, and is the very process that wrote it."""
    if record.ended_ns is not None:
        return False
    if record.pid_ticks is not None and (ticks := start_ticks(record.pid)) is not None:
        return ticks == record.pid_ticks
    try:
        return abs(psutil.Process(record.pid).create_time() - record.pid_started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def _judge(path: Path, record: JobRecord, prune: bool, now_ns: int) -> JobRecord | None:
    """The record with its state filled in, or None when it is stale (then pruned)."""
    if is_running(record):
        return msgspec.structs.replace(record, state="running")
    has_trace = bool(record.trace) and Path(str(record.trace)).exists()
    ended = record.ended_ns or int(path.stat().st_mtime * 1e9)
    if has_trace and now_ns - ended < FINISHED_TTL_S * 1e9:
        return msgspec.structs.replace(record, state="finished", ended_ns=ended)
    if prune:
        path.unlink(missing_ok=True)
    return None


def list_jobs(*, prune: bool = True, include_finished: bool = False) -> list[JobRecord]:
    """This host's jobs, newest first. Stale records are deleted when ``prune``; finished
    jobs that left a trace are included with ``include_finished``."""
    host = socket.gethostname()
    now = time.time_ns()
    found: dict[str, JobRecord] = {}
    for folder in job_dirs():
        try:
            paths = sorted(folder.glob("*.json"))
        except OSError:
            continue
        for path in paths:
            try:
                record = msgspec.json.decode(path.read_bytes(), type=JobRecord)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                if prune:
                    path.unlink(missing_ok=True)
                continue
            if record.host != host:
                continue  # another node's record in a shared home: not ours to judge
            try:
                judged = _judge(path, record, prune, now)
            except OSError:
                continue
            if judged is not None and (include_finished or judged.state == "running"):
                found.setdefault(judged.job_id, judged)
    return sorted(found.values(), key=lambda r: r.started_ns, reverse=True)
