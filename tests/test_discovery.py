"""Discovery records: private files, liveness by pid + creation time, pruning, finished jobs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from zeroscope.cli import main as cli_main
from zeroscope.remote import discovery


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ZEROSCOPE_HOME", str(tmp_path / "zhome"))
    return tmp_path / "zhome" / "jobs"


def _record(job_id: str = "j1", trace: Path | None = None) -> discovery.JobRecord:
    return discovery.JobRecord.here(
        job_id=job_id,
        ingest_address="tcp://127.0.0.1:40001",
        viewer_address="tcp://127.0.0.1:40002",
        token="s3cret",
        trace=trace,
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_register_writes_private_file_and_lists_it(home: Path) -> None:
    handle = discovery.register(_record())
    path = Path(handle.path)
    assert path.parent == home
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    on_disk = json.loads(path.read_text())
    assert on_disk["token"] == "s3cret" and on_disk["viewer_port"] == 40002
    assert on_disk["pid"] == os.getpid()
    [job] = discovery.list_jobs()
    assert (job.job_id, job.state, job.ingest_port, job.bind_host) == (
        "j1",
        "running",
        40001,
        "127.0.0.1",
    )
    discovery.unregister(handle)
    assert not path.exists()
    assert discovery.list_jobs(include_finished=True) == []


def test_existing_wide_folder_is_tightened(home: Path) -> None:
    home.mkdir(parents=True)
    home.chmod(0o755)
    discovery.register(_record())
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_stale_record_is_pruned(home: Path) -> None:
    dead = msgspec.structs.replace(_record("gone"), pid=_dead_pid())
    handle = discovery.register(dead)
    assert discovery.list_jobs(prune=False) == []
    assert Path(handle.path).exists()  # prune=False leaves it
    assert discovery.list_jobs() == []
    assert not Path(handle.path).exists()


def test_recycled_pid_is_not_the_job(home: Path) -> None:
    """Our own pid, but a start that is not ours: another process reusing the pid."""
    rec = _record("recycled")
    assert rec.pid_ticks is not None  # Linux: the start in ticks since boot is read
    earlier = msgspec.structs.replace(
        rec, pid_started=rec.pid_started - 3600, pid_ticks=rec.pid_ticks - 3600 * 100
    )
    discovery.register(earlier)
    assert discovery.list_jobs() == []


def test_recycled_pid_without_ticks_is_judged_by_its_wall_clock_start(home: Path) -> None:
    """A record from before the ticks were kept (or a system without /proc): the wall-clock
    creation time still tells a recycled pid from the job."""
    rec = msgspec.structs.replace(_record("old"), pid_ticks=None)
    discovery.register(msgspec.structs.replace(rec, pid_started=rec.pid_started - 3600))
    assert discovery.list_jobs() == []
    discovery.register(msgspec.structs.replace(rec, job_id="same"))
    assert [j.job_id for j in discovery.list_jobs()] == ["same"]


def test_a_stepped_wall_clock_leaves_a_running_job_running(home: Path) -> None:
    """The wall-clock creation time is the kernel's boot time plus the start in ticks, and the
    boot time moves when the wall clock is stepped (a VM resumed, NTP's step; read in whole
    seconds, even a small step can move it by one): a running job's record then read as
    finished, and an attached viewer ended as if the job were over. The start in ticks never
    moves."""
    rec = _record("stepped")
    for shift in (1.0, -1.0, 3600.0):
        discovery.register(msgspec.structs.replace(rec, pid_started=rec.pid_started + shift))
        [job] = discovery.list_jobs()
        assert (job.job_id, job.state) == ("stepped", "running"), shift


def test_start_ticks_reads_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    """The command name in /proc/PID/stat is free text; the ticks are counted after its end."""
    odd = tmp_path / "py) 1 2 (x"  # the kernel names the process after the file it ran
    odd.symlink_to(sys.executable)
    child = "import sys; print('ready', flush=True); sys.stdin.read()"
    proc = subprocess.Popen(
        [str(odd), "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # exec is done
        assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == odd.name
        import psutil

        ticks = discovery.start_ticks(proc.pid)
        expected = psutil.Process(proc.pid).create_time() - psutil.boot_time()
        assert ticks is not None and abs(ticks / os.sysconf("SC_CLK_TCK") - expected) < 1.5
    finally:
        proc.communicate("")
    assert discovery.start_ticks(proc.pid) is None  # reaped: no such process


def test_finished_job_with_trace_is_kept_as_finished(home: Path, tmp_path: Path) -> None:
    trace = tmp_path / "job.trace"
    trace.write_bytes(b"x")
    handle = discovery.register(msgspec.structs.replace(_record("done", trace), pid=_dead_pid()))
    assert discovery.list_jobs() == []  # not running...
    [job] = discovery.list_jobs(include_finished=True)  # ...but remembered, with its trace
    assert job.state == "finished" and job.trace == str(trace.resolve())
    assert Path(handle.path).exists()
    trace.unlink()  # nothing left to replay: now it is just stale
    assert discovery.list_jobs(include_finished=True) == []
    assert not Path(handle.path).exists()


def test_unregister_with_trace_marks_finished(home: Path, tmp_path: Path) -> None:
    trace = tmp_path / "t.trace"
    trace.write_bytes(b"x")
    handle = discovery.register(_record("t", trace))
    discovery.unregister(handle)
    [job] = discovery.list_jobs(include_finished=True)
    assert job.state == "finished" and job.ended_ns is not None
    assert stat.S_IMODE(Path(handle.path).stat().st_mode) == 0o600


def test_other_hosts_records_are_ignored_not_pruned(home: Path) -> None:
    handle = discovery.register(
        msgspec.structs.replace(_record("far"), host="elsewhere", pid=_dead_pid())
    )
    assert discovery.list_jobs() == []
    assert Path(handle.path).exists()


def test_corrupt_record_is_pruned(home: Path) -> None:
    discovery.register(_record())
    bad = home / "bad.json"
    bad.write_text("{not json")
    assert [j.job_id for j in discovery.list_jobs()] == ["j1"]
    assert not bad.exists()


def test_folders_without_zeroscope_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ZEROSCOPE_HOME", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert discovery.job_dirs() == [
        tmp_path / "run" / "zeroscope",
        tmp_path / "h" / ".cache" / "zeroscope" / "jobs",
    ]
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert discovery.job_dirs() == [tmp_path / "h" / ".cache" / "zeroscope" / "jobs"]


def test_jobs_verb_json_and_table(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["jobs"]) == 0
    assert "no zeroscope jobs" in capsys.readouterr().out
    discovery.register(_record("live1"))
    assert cli_main(["jobs", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["job_id"] == "live1" and row["state"] == "running" and row["viewer_port"] == 40002
    assert cli_main(["jobs"]) == 0
    out = capsys.readouterr().out
    assert "live1" in out and "running" in out and "s3cret" not in out


def test_split_address() -> None:
    assert discovery.split_address("tcp://10.0.0.1:5555") == ("10.0.0.1", 5555)
    assert discovery.split_address("tcp://[::1]:7") == ("::1", 7)
    with pytest.raises(ValueError, match="not a tcp://HOST:PORT"):
        discovery.split_address("ipc:///tmp/x")


def test_unwritable_folder_falls_back_then_warns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("ZEROSCOPE_HOME", raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(blocker))  # stale: cannot hold a folder
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    handle = discovery.register(_record())
    assert Path(handle.path).parent == tmp_path / "h" / ".cache" / "zeroscope" / "jobs"
    monkeypatch.setenv("HOME", str(blocker))
    handle = discovery.register(_record("j2"))
    assert handle.path == ""
    assert "warning: job not listed" in capsys.readouterr().err
    discovery.unregister(handle)  # a no-op, not an error
