"""A throwaway OpenSSH server on 127.0.0.1 for end-to-end tests of ``zeroscope attach``.

Everything lives in a temporary folder: a fresh host key, a client key pair, an
``authorized_keys`` file and the config. The client key's ``authorized_keys`` line carries
``environment="PATH=...,PYTHONPATH=..."`` (sshd's ``PermitUserEnvironment``) so that the
remote ``zeroscope`` resolves to this checkout, exactly as an installed one would on a real
host; ``AcceptEnv ZEROSCOPE_HOME`` lets each test point the remote side at its own discovery
folder with ``-o SetEnv=ZEROSCOPE_HOME=...``.

sshd needs an absolute path, runs in the foreground (``-D``) and logs to stderr (``-e``).
Starting one takes about 0.1 s.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.distributed import free_port

SSHD = "/usr/sbin/sshd"


def sshd_available() -> bool:
    """True when an OpenSSH server and client are installed (CI's .ci/run installs them)."""
    return (
        os.path.exists(SSHD)
        and shutil.which("ssh") is not None
        and shutil.which("ssh-keygen") is not None
    )


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


@dataclass(kw_only=True)
class Sshd:
    """A running sshd; ``client_options()`` are the ssh flags a test passes to attach."""

    dir: Path
    port: int
    key: Path
    """The authorized client key."""
    wrong_key: Path
    """A key the server does not know (for the 'authentication refused' case)."""
    user: str
    allow_forwarding: bool = True
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.dir / "sshd.log"

    @property
    def target(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def client_options(self, *, home: Path | None = None) -> list[str]:
        """``-i``/``-o`` flags for ``zeroscope attach`` (and plain ssh) to reach this server."""
        opts = [
            "-i",
            str(self.key),
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "LogLevel=ERROR",
        ]
        if home is not None:
            opts += ["-o", f"SetEnv=ZEROSCOPE_HOME={home}"]
        return opts

    def start(self) -> None:
        # Root's sshd insists on its privilege-separation folder even with a private config.
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        env_path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        checkout = str(Path(__file__).resolve().parents[1])
        parts = [checkout, *os.environ.get("PYTHONPATH", "").split(":")]
        pythonpath = ":".join(dict.fromkeys(p for p in parts if p))
        pub = (self.key.with_suffix(".pub")).read_text().strip()
        auth = self.dir / "authorized_keys"
        auth.write_text(
            f'environment="PATH={env_path}",environment="PYTHONPATH={pythonpath}" {pub}\n'
        )
        auth.chmod(0o600)
        host_key = self.dir / "host_ed25519"
        _keygen(host_key)
        cfg = self.dir / "sshd_config"
        cfg.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_key}",
                    f"AuthorizedKeysFile {auth}",
                    f"PidFile {self.dir / 'sshd.pid'}",
                    "StrictModes no",
                    "UsePAM no",
                    "PermitRootLogin yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitUserEnvironment yes",
                    "AcceptEnv ZEROSCOPE_HOME",
                    f"AllowTcpForwarding {'yes' if self.allow_forwarding else 'no'}",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stderr=log, stdout=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {self.log.read_text().strip()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("sshd did not start listening within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_sshd(tmp: Path, *, allow_forwarding: bool = True) -> Sshd:
    """Generate keys and config under ``tmp`` and start sshd on a free port of 127.0.0.1."""
    tmp.mkdir(parents=True, exist_ok=True)
    key = tmp / "client_ed25519"
    wrong = tmp / "stranger_ed25519"
    _keygen(key)
    _keygen(wrong)
    server = Sshd(
        dir=tmp,
        port=free_port(),
        key=key,
        wrong_key=wrong,
        user=getpass.getuser(),
        allow_forwarding=allow_forwarding,
    )
    server.start()
    return server
