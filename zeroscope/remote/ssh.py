"""The system's OpenSSH, driven by subprocess: remote ``zeroscope jobs --json`` and ``-L``
tunnels to a collector's viewer port.

Why the ``ssh`` binary and not a Python SSH library: it already knows the user's keys, agent,
``~/.ssh/config`` (ProxyJump, ControlMaster, Kerberos ...) and known_hosts, so ``attach`` works
wherever ``ssh host`` works, and the collector never listens beyond 127.0.0.1.

Failures come back as :class:`SshError` with a one-line reason: host unreachable,
authentication refused, host key rejected, zeroscope not installed there.
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Literal

import msgspec

from zeroscope.remote.discovery import JobRecord

SshFailure = Literal["unreachable", "auth", "hostkey", "not_installed", "remote", "tunnel"]

_UNREACHABLE = (
    "connection refused",
    "no route to host",
    "connection timed out",
    "operation timed out",
    "network is unreachable",
    "could not resolve hostname",
    "name or service not known",
    "connection closed by",
    "connection reset by",
)
_AUTH = ("permission denied", "too many authentication failures", "authentication failed")
_NOISE = ("warning: permanently added", "** ")


class SshError(Exception):
    """A failed SSH step; ``str()`` is one line, ``failure`` says which kind."""

    def __init__(self, failure: SshFailure, message: str) -> None:
        super().__init__(message)
        self.failure = failure


@dataclass(kw_only=True, slots=True)
class SshTarget:
    """``[ssh://][user@]host[:port]`` as given on the command line."""

    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, text: str) -> SshTarget:
        rest = text.removeprefix("ssh://").rstrip("/")
        user, _, hostport = rest.rpartition("@")
        host, port = hostport, None
        if hostport.startswith("["):  # [ipv6]:port
            host, _, tail = hostport[1:].partition("]")
            if tail.startswith(":"):
                port = tail[1:]
        elif hostport.count(":") == 1:
            host, port = hostport.split(":")
        if not host or (port is not None and not port.isdigit()):
            raise ValueError(f"not an SSH target ([ssh://][user@]host[:port]): {text!r}")
        return cls(host=host, user=user or None, port=int(port) if port else None)

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        return self.destination + (f":{self.port}" if self.port else "")


def _last_line(stderr: str) -> str:
    lines = [
        ln.strip()
        for ln in stderr.splitlines()
        if ln.strip() and not ln.strip().lower().startswith(_NOISE)
    ]
    return lines[-1] if lines else ""


@dataclass(kw_only=True)
class SshClient:
    """How to reach one host: target plus the user's ``-i`` and ``-o`` flags."""

    target: SshTarget
    identity: str | None = None
    options: list[str] = field(default_factory=list)
    batch: bool = field(default_factory=lambda: not sys.stdin.isatty())
    """BatchMode=yes: never prompt (no terminal to prompt on); fail instead."""
    connect_timeout: int = 10

    def args(self) -> list[str]:
        """``ssh`` and its flags, up to and including the destination."""
        argv = ["ssh"]
        if self.target.port:
            argv += ["-p", str(self.target.port)]
        if self.identity:
            argv += ["-i", self.identity]
        for opt in self.options:
            argv += ["-o", opt]
        if self.batch:
            argv += ["-o", "BatchMode=yes"]
        argv += [
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
            # A dead path is noticed within ~15 s, so the tunnel is rebuilt instead of hanging.
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=3",
        ]
        return [*argv, self.target.destination]

    def classify(self, returncode: int, stderr: str, *, program: str = "") -> SshError:
        """Turn a failed ssh invocation into a one-line :class:`SshError`."""
        detail = _last_line(stderr)
        low = stderr.lower()
        where = str(self.target)
        if returncode == 255 or not program:
            if "host key verification failed" in low or "remote host identification" in low:
                return SshError("hostkey", f"host key of {where} was rejected ({detail})")
            if any(s in low for s in _AUTH):
                return SshError(
                    "auth",
                    f"authentication to {where} refused ({detail}); check -i KEY or your ssh agent",
                )
            if any(s in low for s in _UNREACHABLE):
                return SshError("unreachable", f"cannot reach {where} over SSH ({detail})")
            return SshError(
                "unreachable", f"ssh to {where} failed: {detail or f'exit {returncode}'}"
            )
        if returncode == 127 or "command not found" in low or "no such file" in low:
            return SshError(
                "not_installed",
                f"zeroscope is not installed on {self.target.host} ({program!r} not found); "
                "install it there or pass --remote-zeroscope PATH",
            )
        return SshError(
            "remote", f"{program} on {self.target.host} failed: {detail or f'exit {returncode}'}"
        )

    def run(self, remote_argv: list[str], *, timeout: float = 60.0) -> str:
        """Run a command there; its stdout, or :class:`SshError`."""
        argv = [*self.args(), "--", remote_command(remote_argv)]
        try:
            done = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise SshError(
                "unreachable", f"ssh to {self.target} timed out after {timeout:.0f} s"
            ) from None
        except FileNotFoundError:
            raise SshError(
                "unreachable", "the OpenSSH client (ssh) is not installed here"
            ) from None
        if done.returncode != 0:
            raise self.classify(done.returncode, done.stderr, program=remote_argv[0])
        return done.stdout

    def remote_jobs(self, zeroscope: str = "zeroscope") -> list[JobRecord]:
        """Every job (running and finished) the remote ``zeroscope jobs`` knows of."""
        out = self.run([zeroscope, "jobs", "--json", "--all"])
        try:
            return msgspec.json.decode(out.strip() or "[]", type=list[JobRecord])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise SshError(
                "remote",
                f"unexpected output from {zeroscope} jobs on {self.target.host}: "
                f"{str(exc).splitlines()[0]}",
            ) from None

    def tunnel(self, *remote_ports: int) -> Tunnel:
        """An (unopened) tunnel forwarding a free local port to each remote loopback port."""
        return Tunnel(client=self, forwards={free_port(): p for p in remote_ports})


def remote_command(argv: list[str]) -> str:
    """The command line for the remote shell: quoted, except that a leading ``~/`` on the
    program stays unquoted so the remote shell expands it to the remote home."""
    program, rest = argv[0], argv[1:]
    tilde = program.startswith("~/")
    head = "~/" + shlex.quote(program[2:]) if tilde else shlex.quote(program)
    return " ".join([head, *(shlex.quote(a) for a in rest)])


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


@dataclass(kw_only=True)
class Tunnel:
    """``ssh -N -L 127.0.0.1:LOCAL:127.0.0.1:REMOTE ...`` as a child process.

    ``ExitOnForwardFailure=yes`` makes ssh exit (instead of idling) when a local port cannot
    be bound; the local listeners exist only once authentication succeeded, so "the ports
    accept connections" is the sign the tunnel is up. Reopening reuses the same local ports,
    so ZeroMQ sockets connected to them simply reconnect.
    """

    client: SshClient
    forwards: dict[int, int]
    """local port -> remote port (both on 127.0.0.1 of their machine)."""
    proc: subprocess.Popen[bytes] | None = None
    _stderr: IO[bytes] | None = None

    def local_address(self, remote_port: int) -> str:
        """``tcp://127.0.0.1:LOCAL`` for the local end of ``remote_port``."""
        for local, remote in self.forwards.items():
            if remote == remote_port:
                return f"tcp://127.0.0.1:{local}"
        raise KeyError(remote_port)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def open(self, timeout: float = 20.0) -> None:
        """Start ssh and wait until the local ends accept connections; SshError otherwise."""
        self.close()
        c = self.client
        argv = c.args()
        flags = ["-N", "-o", "ExitOnForwardFailure=yes"]
        for local, remote in self.forwards.items():
            flags += ["-L", f"127.0.0.1:{local}:127.0.0.1:{remote}"]
        argv[1:1] = flags
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as ssh does)
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr
        )
        deadline = time.monotonic() + timeout
        waiting = set(self.forwards)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._stderr.seek(0)
                err = self._stderr.read().decode(errors="replace")
                rc = self.proc.returncode
                self.close()
                failure = c.classify(rc, err)
                if "forward" in err.lower() or "bind" in err.lower():
                    failure = SshError("tunnel", f"tunnel to {c.target} failed: {_last_line(err)}")
                raise failure
            waiting = {p for p in waiting if not port_open(p)}
            if not waiting:
                return
            time.sleep(0.05)
        self.close()
        raise SshError("unreachable", f"tunnel to {c.target} not up after {timeout:.0f} s")

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=3)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
