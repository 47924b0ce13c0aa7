"""Pilot tests of what the live view says about its job: the first failing rank's error on
screen while the view is up (not only after quitting), the rank that raised flagged ``raised``
and the one torchrun stopped ``killed`` (not ``comm``), the job named before any rank reports,
and a view of a finished job no longer saying LIVE.

The job is a real :class:`zeroscope.run.job.Job` (supervision, output relay, error scanner) around a
stand-in for torchrun: a Python process that prints a rank's traceback as torch prints it and
writes torchrun's outcome file, so no process group is needed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import screen_text, sync
from zeroscope.agent.schema import Bye
from zeroscope.run.job import Job
from zeroscope.run.launch import QueueSource
from zeroscope.state import ClusterState
from zeroscope.state.alerts import AlertRules
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.feed import LiveFeed
from zeroscope.tui.rank_rows import flags_from_alerts

ROOT = Path(__file__).resolve().parent.parent
ERROR = "ConfigError: unknown key 'reduce_bucket_sise' (did you mean 'reduce_bucket_size'?)"
TORCHRUN_STANDIN = f"""
import os, signal, sys, time
from zeroscope.run.job_end import OUTCOME_ENV, Outcome, RankExit
from zeroscope.run.supervision import announce_ready

def finish(*_):
    exits = (RankExit(rank=0, exitcode=1), RankExit(rank=1, exitcode=-15))
    Outcome(exits=exits).save(os.environ[OUTCOME_ENV])
    sys.exit(1)

signal.signal(signal.SIGINT, finish)  # as torchrun: stop the workers, say how they ended
announce_ready(os.environ)
sys.stderr.write(
    "[rank0]: Traceback (most recent call last):\\n"
    '[rank0]:   File "train.py", line 9, in <module>\\n'
    "[rank0]: {ERROR}\\n"
)
sys.stderr.flush()
while not os.path.exists(sys.argv[1]):  # the test says when the job ends
    time.sleep(0.05)
finish()
"""


def crashed_state() -> ClusterState:
    """Two ranks whose comm is exposed (a "comm" flag each) and who both said Bye(1)."""
    state = ClusterState(rules=AlertRules(exposed_max=0.0))
    state.ingest_all(synthetic_run(RunShape(ranks=2, steps=6)))
    for r in (0, 1):
        state.ingest(Bye(rank=r, step=6, wall_ns=time.time_ns(), exit_code=1, message="x"))
    return state


async def _wait(pilot: object, ok: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():  # type: ignore[operator]
        assert time.monotonic() < deadline
        await pilot.pause(0.1)  # type: ignore[attr-defined]


@sync
async def test_the_first_failure_is_on_screen_and_the_ranks_flagged_by_how_they_ended(
    tmp_path: Path,
) -> None:
    state = crashed_state()
    # From the ranks' own word alone, how they ended outranks their exposed comm.
    assert flags_from_alerts(state, state.alerts()) == {0: "exited", 1: "exited"}
    go = tmp_path / "end"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    job = Job(
        [sys.executable, "-c", TORCHRUN_STANDIN, str(go)],
        env,
        str(tmp_path / "job.log"),
        forward=False,
    )
    try:
        app = ZeroscopeApp(state, LiveFeed(QueueSource()), job=job)
        async with app.run_test(size=(160, 48)) as pilot:
            await _wait(pilot, lambda: "ConfigError" in screen_text(app))
            assert job.returncode is None  # on screen while the job still runs
            text = screen_text(app)
            assert f"r0 failed: {ERROR}" in text
            assert text.count("reduce_bucket_size") == 1  # once, not once per rank
            go.touch()
            await _wait(pilot, lambda: "job exited (1)" in screen_text(app))
            await pilot.pause(0.3)
            text = screen_text(app)
            assert f"r0 failed first (exit code 1): {ERROR}" in text
            assert "r1 stopped by torchrun after r0 failed" in text
            flags = flags_from_alerts(app.state, app.alerts())
            assert flags == {0: "raised", 1: "killed"}
            rows = [ln for ln in text.splitlines() if ln.strip("│ ").startswith(("r0 ", "r1 "))]
            assert "raised" in rows[0] and "killed" in rows[1]
    finally:
        go.touch()
        job.end()
    assert "[rank0]: Traceback" in (tmp_path / "job.log").read_text()  # all of it kept


@sync
async def test_the_error_fits_an_80_column_screen() -> None:
    from zeroscope.run.job import end_alerts
    from zeroscope.run.job_end import JobEnd

    class Failed:
        returncode = 1
        log = "runs/j.log"

        def alerts(self) -> list:
            return end_alerts(JobEnd(1, rank=0, error=ERROR, followers=(1,)))

    app = ZeroscopeApp(crashed_state(), job=Failed(), live_clock=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        flat = " ".join(" ".join(screen_text(app).split()).split("│"))
        assert "did you mean 'reduce_bucket_size'?" in " ".join(flat.split())


@sync
async def test_the_job_is_named_before_any_rank_reports() -> None:
    state = ClusterState()
    state.job_id = "20261130-071506-ac32"
    app = ZeroscopeApp(state, live_clock=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        header = screen_text(app).splitlines()[0]
        assert header.startswith(" zeroscope  20261130-071506-ac32 │")  # not "NA"


@sync
async def test_a_view_of_a_finished_job_stops_saying_live() -> None:
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=2, steps=3)))
    app = ZeroscopeApp(state, live_clock=True)  # as attach runs it: no job handle
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        assert "LIVE" in screen_text(app).splitlines()[0]
        app.state.ingest(Bye(rank=0, step=3, wall_ns=time.time_ns()))
        app.redraw()
        await pilot.pause()
        assert "LIVE" in screen_text(app).splitlines()[0]  # rank 1 still runs
        app.state.ingest(Bye(rank=1, step=3, wall_ns=time.time_ns()))
        app.redraw()
        await pilot.pause()
        header = screen_text(app).splitlines()[0]
        assert "ENDED" in header and "LIVE" not in header
    # The tunnel keeper learns the job is gone although not every rank said Bye.
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=2, steps=3)))
    app = ZeroscopeApp(state, live_clock=True)
    async with app.run_test(size=(160, 48)) as pilot:
        app.mark_over()
        await pilot.pause()
        header = screen_text(app).splitlines()[0]
        assert "ENDED" in header and "LIVE" not in header


def test_a_stop_after_a_rank_failed_keeps_the_failure(tmp_path: Path) -> None:
    """Ctrl-C while torchrun is already shutting down after a rank's failure only hurries it:
    the end is that failure, not "stopped on request"."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    job = Job(
        [sys.executable, "-c", TORCHRUN_STANDIN, str(tmp_path / "never")],
        env,
        None,
        forward=False,
    )
    deadline = time.monotonic() + 60
    while not job.scanner.errors():
        assert time.monotonic() < deadline and job.returncode is None
        time.sleep(0.05)
    job.interrupt("Ctrl-C")
    end = job.end()
    assert (end.stopped, end.code, end.rank, end.error) == (None, 1, 0, ERROR)
