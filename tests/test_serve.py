"""``zeroscope serve``: the environment it hands a job, its private files, its discovery
record, and the messages it turns away (no token, wrong token, oversized), counted."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from zeroscope.agent.publish import set_credentials
from zeroscope.agent.schema import MAX_MESSAGE_BYTES, SCHEMA_VERSION, Hello, encode
from zeroscope.cli import main as cli_main
from zeroscope.remote import discovery
from zeroscope.store.trace import TraceReader


def _serve(home: Path, *argv: str) -> subprocess.Popen[str]:
    env = {**os.environ, "ZEROSCOPE_HOME": str(home)}
    env.pop("ZEROSCOPE_TOKEN", None)
    return subprocess.Popen(
        [sys.executable, "-m", "zeroscope", "serve", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _hello(rank: int) -> bytes:
    return encode(Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=rank, world_size=4))


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_serve_hands_out_env_keeps_secrets_private_and_rejects_strangers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, trace, env_file = tmp_path / "zh", tmp_path / "t.zstrace", tmp_path / "job.env"
    proc = _serve(home, "--record", str(trace), "--env-file", str(env_file), "--job-id", "j")
    try:
        line = proc.stdout.readline().strip()  # type: ignore[union-attr]
        words = shlex.split(line)
        assert words[0] == "export", line
        env = dict(w.split("=", 1) for w in words[1:])
        assert env["ZEROSCOPE_JOB_ID"] == "j"
        assert env["ZEROSCOPE_COLLECTOR"].startswith("tcp://127.0.0.1:")
        token = env["ZEROSCOPE_TOKEN"]
        assert len(bytes.fromhex(token)) == 16

        monkeypatch.setenv("ZEROSCOPE_HOME", str(home))
        [job] = discovery.list_jobs()
        assert (job.job_id, job.kind, job.token, job.pid) == ("j", "serve", token, proc.pid)
        assert job.ingest_port == discovery.split_address(env["ZEROSCOPE_COLLECTOR"])[1]
        assert job.pub_port and job.viewer_port and job.trace == str(trace.resolve())
        assert _mode(home / "jobs") == 0o700
        assert _mode(home / "jobs" / "j.json") == 0o600
        assert _mode(env_file) == 0o600 and env_file.read_text().strip() == line
        assert _mode(trace) == 0o600

        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        set_credentials(push, token.encode())  # the connection's; each frame is checked too
        push.connect(env["ZEROSCOPE_COLLECTOR"])
        push.send_multipart([b"", _hello(0)])  # no token
        push.send_multipart([b"0" * 32, _hello(1)])  # wrong token
        push.send_multipart([token.encode(), _hello(2)])  # the job's own rank
        push.send_multipart([token.encode(), b"\x00" * (MAX_MESSAGE_BYTES + 16)])  # oversized
        push.close(linger=2000)
        ctx.term()
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "received 4, accepted 1, rejected: oversize 1, unauthenticated 2" in err
    with TraceReader(trace) as reader:
        assert [h.rank for h in reader.hellos()] == [2]
    # It stopped: with a trace on disk the job stays listed, as finished.
    [job] = discovery.list_jobs(include_finished=True)
    assert job.state == "finished"


def test_non_loopback_bind_without_authentication_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEROSCOPE_HOME", str(tmp_path))
    code = cli_main(["serve", "--bind", "0.0.0.0", "--insecure-no-token", "--no-record"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("zeroscope: error: refusing to listen on 0.0.0.0 without authentication")
    assert len(err.strip().splitlines()) == 1
    assert discovery.list_jobs() == []


def test_serve_wraps_a_command_and_returns_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "zh"
    script = (
        "import json, os, sys; "
        "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('ZEROSCOPE_')})); "
        "sys.exit(3)"
    )
    proc = _serve(home, "--no-record", "--", sys.executable, "-c", script)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    env = json.loads(out.strip().splitlines()[-1])
    assert env["ZEROSCOPE_COLLECTOR"].startswith("tcp://127.0.0.1:")
    assert len(env["ZEROSCOPE_TOKEN"]) == 32 and env["ZEROSCOPE_JOB_ID"]
    monkeypatch.setenv("ZEROSCOPE_HOME", str(home))
    assert discovery.list_jobs(include_finished=True) == []  # no trace: nothing to remember


def test_existing_trace_is_not_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEROSCOPE_HOME", str(tmp_path))
    trace = tmp_path / "old.zstrace"
    trace.write_bytes(b"precious")
    assert cli_main(["serve", "--record", str(trace)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert trace.read_bytes() == b"precious"


def test_nothing_on_the_receiving_side_can_unpickle() -> None:
    """The collector, viewers, trace store and agent decode msgpack/JSON into typed Structs only:
    no pickle, marshal or shelve, and none of pyzmq's pickling helpers (recv_pyobj)."""
    root = Path(__file__).resolve().parents[1]
    banned = re.compile(
        r"\bimport (c?pickle|marshal|shelve|dill)\b|\b(recv|send)_pyobj\b|pickle\.loads?\("
    )
    offenders = [
        f"{path.relative_to(root)}:{n}: {line.strip()}"
        for folder in ("zeroscope", "agent")
        for path in sorted((root / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if banned.search(line)
    ]
    assert offenders == []


@pytest.mark.slow
def test_serve_prints_a_line_per_step_on_stderr_while_the_job_runs(tmp_path: Path) -> None:
    """``serve -- torchrun ...`` shows the job's progress as ``run --headless`` does (the steps
    the agent reported, one line each, in order), on stderr: the job's stdout stays its own."""
    steps = 6
    script = Path(__file__).parent / "scripts" / "agent_only_train.py"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    proc = _serve(
        tmp_path / "zh",
        "--no-record",
        "--",
        *torchrun,
        str(script),
        "--steps",
        str(steps),
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("step ")]
    assert [int(ln.split()[1]) for ln in lines] == list(range(1, steps + 1)), err[-3000:]
    assert not any(ln.startswith("step ") for ln in out.splitlines())
    quiet = _serve(tmp_path / "zq", "--no-record", "--quiet", "--", *torchrun, str(script))
    _, err = quiet.communicate(timeout=300)
    assert quiet.returncode == 0, err[-3000:]
    assert not any(ln.startswith("step ") for ln in err.splitlines())
