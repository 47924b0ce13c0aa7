"""``zeroscope serve`` without a command (the ``--env-file`` way) ends with the job it serves:
once every rank of the world said Bye, it stops and ``zeroscope jobs`` lists the job as
finished, no longer as running for ever."""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import pytest

from tests.test_serve import _serve
from zeroscope.agent.publish import Publisher
from zeroscope.agent.schema import SCHEMA_VERSION, Bye, Hello
from zeroscope.remote import discovery


def test_serve_without_a_command_ends_when_every_rank_said_bye(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, env_file = tmp_path / "zh", tmp_path / "job.env"
    proc = _serve(home, "--record", str(tmp_path / "t.zstrace"), "--env-file", str(env_file))
    publisher = None
    try:
        assert proc.stdout is not None
        env = dict(w.split("=", 1) for w in shlex.split(proc.stdout.readline())[1:])
        # The ranks' own sender, as the job that sourced the env file would have it.
        publisher = Publisher(env["ZEROSCOPE_COLLECTOR"], env["ZEROSCOPE_TOKEN"].encode())
        assert publisher.wait_connected(10)
        for rank in (0, 1):
            publisher.send(
                Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=rank, world_size=2)
            )
        publisher.send(Bye(rank=0, step=3, wall_ns=time.time_ns()))
        time.sleep(2.0)
        monkeypatch.setenv("ZEROSCOPE_HOME", str(home))
        assert proc.poll() is None  # rank 1 still runs
        assert [j.state for j in discovery.list_jobs()] == ["running"]
        publisher.send(Bye(rank=1, step=3, wall_ns=time.time_ns()))
        _, err = proc.communicate(timeout=20)  # before: it served until killed
    finally:
        if publisher is not None:
            publisher.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "is over (every rank said Bye)" in err
    assert discovery.list_jobs() == []
    [job] = discovery.list_jobs(include_finished=True)
    assert job.state == "finished"
