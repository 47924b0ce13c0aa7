"""``zeroscope attach`` through a real sshd on 127.0.0.1: each failure is one clear line.

The sshd fixture (tests/sshd.py) makes the remote ``zeroscope`` resolve to this checkout; each
test points the remote side at its own discovery folder with ``-o SetEnv=ZEROSCOPE_HOME=...``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import psutil
import pytest

from tests.sshd import Sshd, sshd_available, start_sshd
from zeroscope.cli import main as cli_main
from zeroscope.remote import discovery
from zeroscope.remote.ssh import SshTarget, free_port

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not sshd_available(), reason="needs OpenSSH server and client"),
]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


def _attach(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli_main(["attach", *argv])
    err = capsys.readouterr().err.strip()
    return code, err


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("zeroscope: error: ")
    return lines[0]


def test_unreachable_host(sshd: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    closed = free_port()
    code, err = _attach([f"127.0.0.1:{closed}", *sshd.client_options()], capsys)
    assert code == 2
    assert f"cannot reach 127.0.0.1:{closed} over SSH" in _one_line(err)
    assert "Connection refused" in err


def test_authentication_refused(sshd: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    opts = sshd.client_options()
    opts[1] = str(sshd.wrong_key)
    code, err = _attach([sshd.target, *opts], capsys)
    assert code == 2
    line = _one_line(err)
    assert f"authentication to {sshd.target} refused" in line and "Permission denied" in line


def test_zeroscope_not_installed_there(sshd: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [sshd.target, *sshd.client_options(), "--remote-zeroscope", "/nonexistent/zeroscope"]
    code, err = _attach(argv, capsys)
    assert code == 2
    line = _one_line(err)
    assert "zeroscope is not installed on 127.0.0.1" in line and "--remote-zeroscope" in line


def test_no_jobs(sshd: Sshd, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _attach([sshd.target, *sshd.client_options(home=tmp_path / "empty")], capsys)
    assert code == 2
    assert "no zeroscope jobs on 127.0.0.1" in _one_line(err)


def _remote_record(
    home: Path, monkeypatch: pytest.MonkeyPatch, **changes: object
) -> discovery.JobRecord:
    """Write a record as the remote side would (same machine, its ZEROSCOPE_HOME)."""
    monkeypatch.setenv("ZEROSCOPE_HOME", str(home))
    rec = discovery.JobRecord.here(
        job_id="j-old",
        ingest_address="tcp://127.0.0.1:1",
        viewer_address="tcp://127.0.0.1:2",
        token="t",
    )
    rec = msgspec.structs.replace(rec, **changes)
    discovery.register(rec)
    monkeypatch.delenv("ZEROSCOPE_HOME")
    return rec


def test_finished_job_offers_replay(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "run 1.trace"
    trace.write_bytes(b"trace")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    home = tmp_path / "zh"
    _remote_record(home, monkeypatch, pid=dead.pid, trace=str(trace))
    opts = sshd.client_options(home=home)
    for argv in ([sshd.target, *opts], [sshd.target, *opts, "--job", "j-old"]):
        code, err = _attach(argv, capsys)
        assert code == 2
        line = _one_line(err)
        assert "job j-old on 127.0.0.1 already finished" in line
        assert f"scp -P {sshd.port} -i {sshd.key} '{sshd.user}@127.0.0.1:{trace}' ." in line
        assert "zeroscope replay 'run 1.trace'" in line


def test_unknown_job_and_several_running(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "zh"
    _remote_record(home, monkeypatch, job_id="a")  # alive: this test process
    _remote_record(home, monkeypatch, job_id="b")
    opts = sshd.client_options(home=home)
    code, err = _attach([sshd.target, *opts], capsys)
    assert code == 2 and "2 jobs run on 127.0.0.1" in _one_line(err) and "--job" in err
    code, err = _attach([sshd.target, *opts, "--job", "zzz"], capsys)
    assert code == 2 and "no job zzz on 127.0.0.1" in _one_line(err)
    assert cli_main(["attach", sshd.target, *opts, "--list"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("JOB") and sorted(r.split()[:2][0] for r in rows[1:]) == ["a", "b"]
    assert all(r.split()[1] == "running" for r in rows[1:])


def test_bad_target(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _attach(["user@host:notaport"], capsys)
    assert code == 2 and "not an SSH target" in _one_line(err)


def test_target_forms() -> None:
    t = SshTarget.parse("ssh://alice@gpu-01:2222")
    assert (t.user, t.host, t.port, t.destination) == ("alice", "gpu-01", 2222, "alice@gpu-01")
    assert SshTarget.parse("gpu-01") == SshTarget(host="gpu-01")
    assert SshTarget.parse("bob@[::1]:22") == SshTarget(host="::1", user="bob", port=22)


def test_remote_command_quoting() -> None:
    from zeroscope.remote.ssh import remote_command

    assert (
        remote_command(["~/venv/bin/zeroscope", "jobs", "--json"])
        == "~/venv/bin/zeroscope jobs --json"
    )
    assert remote_command(["/opt/my env/zeroscope", "a;b"]) == "'/opt/my env/zeroscope' 'a;b'"


@pytest.mark.timeout(60)
def test_server_refusing_port_forwarding_is_named(tmp_path: Path) -> None:
    """Many clusters set AllowTcpForwarding no: the tunnel opens but carries nothing."""
    server = start_sshd(tmp_path / "sshd", allow_forwarding=False)
    home = tmp_path / "zh"
    env = {**os.environ, "ZEROSCOPE_HOME": str(home)}
    serve = subprocess.Popen(
        [sys.executable, "-m", "zeroscope", "serve", "--no-record"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    attach = None
    try:
        assert serve.stdout is not None and serve.stdout.readline().startswith("export ")
        attach = subprocess.Popen(
            [sys.executable, "-m", "zeroscope", "attach", server.target,
             *server.client_options(home=home), "--headless"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert attach.stderr is not None
        lines = []
        for line in attach.stderr:
            lines.append(line)
            if "no answer from the collector" in line:
                break
        assert "does the SSH server on 127.0.0.1 allow TCP forwarding" in lines[-1], lines
        # A SIGTERM'd attach closes its tunnel on the way out (it used to leave ssh -N running).
        tunnel = psutil.Process(attach.pid).children(recursive=True)
        assert any(p.name() == "ssh" for p in tunnel), tunnel
        attach.terminate()
        assert attach.wait(timeout=10) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(tunnel, timeout=10)
        assert not alive, alive
    finally:
        for proc in (attach, serve):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
        server.stop()
