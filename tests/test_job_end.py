"""How a job's end is read and told, without launching a job: the ranks' error lines in real
tracebacks (printed by Python and torch.distributed's own excepthook in a subprocess), the
rules that pick the first failing rank from torchrun's outcome, and the summary's sentences."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import free_port
from zeroscope.agent.schema import SCHEMA_VERSION, Bye, Hello
from zeroscope.run.job_end import JobEnd, Outcome, RankExit, classify
from zeroscope.run.job_errors import ErrorScanner, RankError
from zeroscope.state import ClusterState
from zeroscope.state.lines import summary_lines

RAISE = """
class ConfigError(ValueError):
    pass
def check():
    try:
        {}["reduce_bucket_sise"]
    except KeyError as exc:
        raise ConfigError("unknown key 'reduce_bucket_sise' (did you mean 'reduce_bucket_size'?)") from exc
print("loss 0.5", flush=True)
check()
"""
ERROR = "ConfigError: unknown key 'reduce_bucket_sise' (did you mean 'reduce_bucket_size'?)"


def _stderr_of(code: str) -> list[str]:
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    return run.stderr.splitlines()


@pytest.fixture(scope="module")
def rank_traceback() -> list[str]:
    """What rank 0 prints when it raises after init_process_group (torch prefixes every line)."""
    init = (
        "import torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', "
        "rank=0, world_size=1)\n"
    )
    return _stderr_of(init + RAISE)


def test_a_ranks_traceback_is_shown_and_its_last_exception_kept(
    rank_traceback: list[str],
) -> None:
    """The traceback is the job's output, shown as torchrun shows it (hiding tracebacks also hid
    the ones a script prints for errors it handles); the end of the run names the error."""
    assert any(line.startswith("[rank0]: Traceback") for line in rank_traceback)
    assert "" in rank_traceback  # the chained traceback's blank lines carry no prefix
    scanner = ErrorScanner()
    shown = [line for line in rank_traceback if scanner.feed(line)]
    assert shown == rank_traceback
    assert scanner.error_of(0) == ERROR  # the raised one, not the KeyError it chains
    assert [e.rank for e in scanner.errors()] == [0]


def test_torchs_own_rank_prefixed_warnings_pass(tmp_path: Path) -> None:
    """torch prefixes its C++ warnings with the rank too once the group is up; a headless run
    hid them all (a new user's DDP with find_unused_parameters=True lost torch's advice)."""
    script = tmp_path / "ddp_warns.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        f"dist.init_process_group('gloo', init_method='tcp://127.0.0.1:{free_port()}', "
        "rank=0, world_size=1)\n"
        "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4), "
        "find_unused_parameters=True)\n"
        "for _ in range(2):\n"
        "    m(torch.ones(2, 4)).sum().backward()\n"
        "dist.destroy_process_group()\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    warned = [line for line in run.stderr.splitlines() if "find_unused_parameters" in line]
    assert warned and all(line.startswith("[rank0]:[W") for line in warned), run.stderr
    scanner = ErrorScanner()
    assert [line for line in warned if scanner.feed(line)] == warned
    assert scanner.errors() == []


def test_a_traceback_before_the_process_group_is_read_too() -> None:
    lines = _stderr_of(RAISE)
    scanner = ErrorScanner()
    shown = [line for line in ["loss 0.5", *lines, "next"] if scanner.feed(line)]
    assert shown == ["loss 0.5", *lines, "next"]  # every line of the job's passes
    (error,) = scanner.errors()
    assert error.rank is None and error.line == ERROR


def test_a_traceback_the_script_prints_for_a_handled_error_is_shown() -> None:
    """A script that catches an error, prints its traceback and trains on (a checkpoint write
    that failed): a new user's run under zeroscope lost both tracebacks from the console."""
    printed = (
        "import traceback\n"
        "try:\n"
        "    open('/nonexistent/dir/ckpt.pt', 'wb')\n"
        "except OSError:\n"
        "    traceback.print_exc()\n"
        "print('training on')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", printed], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0 and run.stdout == "training on\n"
    lines = run.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "FileNotFoundError" in lines[-1]
    scanner = ErrorScanner()
    assert [line for line in lines if scanner.feed(line)] == lines


def test_torchruns_shutdown_chatter_is_hidden() -> None:
    scanner = ErrorScanner()
    # Lines as torch 2.13's torchrun logs them (torch/distributed/elastic/...).
    assert not scanner.feed(
        "W1130 06:49:17.304000 11447 torch/distributed/elastic/multiprocessing/api.py:1028] "
        "Sending process 11496 closing signal SIGTERM"
    )
    assert not scanner.feed(
        "E1130 06:49:17.380000 11447 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1) local_rank: 0 (pid: 11495) of binary: /usr/bin/python"
    )
    assert scanner.feed("W1130 06:49:17.304000 11447 my_training.py:12] a warning of the job's")


def test_the_first_failure_decides_the_code_and_the_line() -> None:
    r0 = RankError(0, ERROR, seq=3)
    r1 = RankError(1, "RuntimeError: Connection closed by peer", seq=9)
    # torchrun's outcome of tests/scripts/failing_train.py: rank 0 raised (exit 1), rank 1
    # raised in turn but was SIGTERMed by torchrun before it could exit on its own.
    end = classify(
        1, Outcome(exits=(RankExit(rank=0, exitcode=1), RankExit(rank=1, exitcode=-15))), [r0, r1]
    )
    assert end == JobEnd(1, rank=0, error=ERROR, followers=(1,))  # its error: a consequence
    # Every rank failed the same config check: the later one is not said to be merely stopped
    # (a new user's ZeRO-3 run read "torchrun then stopped rank 0" over rank 0's own error).
    end = classify(
        1,
        Outcome(exits=(RankExit(rank=0, exitcode=-15), RankExit(rank=1, exitcode=1))),
        [RankError(1, ERROR, seq=2), RankError(0, ERROR, seq=5)],
    )
    assert end.sentences() == [
        f"rank 1 failed first (exit code 1): {ERROR}",
        "rank 0 raised the same error too; torchrun then stopped it",
    ]
    # A rank killed by a signal failed first, whatever its peers printed afterwards.
    end = classify(
        1, Outcome(exits=(RankExit(rank=0, exitcode=1), RankExit(rank=1, exitcode=-9))), [r0]
    )
    assert (end.code, end.rank, end.error) == (137, 1, "killed by SIGKILL")
    # A rank that raised, then died of a signal (torch's gloo teardown aborting it): the error
    # is the cause, said first; the code is the signal's.
    end = classify(
        134, Outcome(exits=(RankExit(rank=0, exitcode=-6), RankExit(rank=1, exitcode=-15))), [r0]
    )
    assert (end.code, end.rank, end.error) == (134, 0, f"{ERROR} (then killed by SIGABRT)")
    # Two ranks raised: the earlier traceback.
    early_r1 = RankError(1, "RuntimeError: CUDA error", seq=1)
    end = classify(
        1,
        Outcome(exits=(RankExit(rank=0, exitcode=1), RankExit(rank=1, exitcode=1))),
        [early_r1, r0],
    )
    assert (end.rank, end.error) == (1, "RuntimeError: CUDA error")
    # Its output went elsewhere (torchrun's --redirects): what its agent reported.
    end = classify(1, Outcome(exits=(RankExit(rank=0, exitcode=1),)), [], reported={0: ERROR})
    assert (end.rank, end.error) == (0, ERROR)
    # sys.exit(3): the rank's own code.
    end = classify(1, Outcome(exits=(RankExit(rank=2, exitcode=3),)), [])
    assert (end.code, end.error) == (3, "exited with code 3 without a traceback")


def test_a_job_that_spawned_its_ranks_fails_as_the_job_naming_no_rank() -> None:
    # torch.multiprocessing.spawn under torchrun: torchrun's rank 0 is the spawner, which
    # prints the spawned rank's traceback (unprefixed); the reporting rank 0 is another process,
    # stopped by the spawner (its Bye: SIGTERM), and must not be named as the failure.
    spawned = RankError(None, "RuntimeError: rank 1 broke at step 3", seq=1)
    exits = Outcome(exits=(RankExit(rank=0, exitcode=1),))
    reported = {0: "SIGTERM: stopped from outside", 1: "RuntimeError: rank 1 broke at step 3"}
    end = classify(1, exits, [spawned], reported=reported, named=False)
    assert end == JobEnd(1, error="RuntimeError: rank 1 broke at step 3")
    assert end.sentences() == ["the job failed (exit code 1): RuntimeError: rank 1 broke at step 3"]
    # As the launcher's ranks (named), the same outcome names torchrun's rank 0.
    assert classify(1, exits, [spawned], reported=reported).rank == 0


def test_a_stop_on_request_is_said_so_whatever_the_ranks_did() -> None:
    exits = Outcome(exits=(RankExit(rank=0, exitcode=1), RankExit(rank=1, exitcode=-9)))
    for returncode in (1, 130, -9, 0):
        end = classify(returncode, exits, [RankError(0, "KeyboardInterrupt", 1)], "Ctrl-C")
        assert end.code == 130 and end.sentences("x.log") == ["job stopped on request (Ctrl-C)"]
    assert classify(143, None, [], "SIGTERM", 143).code == 143


def test_sentences_are_plain() -> None:
    end = JobEnd(1, rank=0, error=ERROR, followers=(1, 2))
    assert end.sentences("runs/j.log") == [
        f"rank 0 failed first (exit code 1): {ERROR}",
        "torchrun then stopped ranks 1, 2",
        "the job's full output: runs/j.log",
    ]
    assert JobEnd(0).sentences("runs/j.log") == []
    assert classify(1, None, []).sentences() == ["the job failed (exit code 1)"]
    assert classify(-signal.SIGKILL, None, []).code == 137


def test_the_summary_speaks_in_sentences() -> None:
    state = ClusterState()
    state.job_id = "j1"
    assert summary_lines(state)[0] == "job j1: no rank reported"
    now = time.time_ns()
    for r in (0, 1):
        state.ingest(
            Hello(schema_version=SCHEMA_VERSION, job_id="j1", rank=r, world_size=2), now / 1e9
        )
    assert summary_lines(state)[0] == "job j1: 2 ranks reported, no step completed"
    state.ingest(Bye(rank=1, step=0, wall_ns=now + 2, exit_code=1, message="RuntimeError: reset"))
    state.ingest(Bye(rank=0, step=0, wall_ns=now + 1, exit_code=1, message=ERROR))
    lines = summary_lines(state)
    # In the order the ranks said it: rank 0 first. No Python dict anywhere.
    errors = [ln for ln in lines if "exited with code" in ln]
    assert errors == [
        f"rank 0 exited with code 1: {ERROR}",
        "rank 1 exited with code 1: RuntimeError: reset",
    ]
    assert not any("{" in ln for ln in lines)


def test_interrupted_ranks_are_not_errors() -> None:
    state = ClusterState()
    now = time.time_ns()
    for r in (0, 1):
        state.ingest(
            Hello(schema_version=SCHEMA_VERSION, job_id="j", rank=r, world_size=2), now / 1e9
        )
        state.ingest(Bye(rank=r, step=0, wall_ns=now, exit_code=1, message="KeyboardInterrupt: "))
    lines = summary_lines(state)
    assert "r0,r1 stopped by KeyboardInterrupt" in lines
    assert not any("exited with code" in ln for ln in lines)
    assert "exited" not in {a.kind for a in state.alerts()}


def _two_ranks_reported(steps: int = 3) -> ClusterState:
    """Two ranks that reported ``steps`` steps (tests/fixtures' synthetic reports)."""
    from tests.fixtures import RunShape, synthetic_run

    state = ClusterState()
    for message in synthetic_run(RunShape(ranks=2, steps=steps)):
        state.ingest(message)
    return state


def test_the_launchers_end_in_a_trace_names_the_rank_a_bye_cannot() -> None:
    """Rank 1 ends by ``sys.exit(3)``: its Bye leaves from the agent's exit hook, which cannot
    see that code (exit code 0), while rank 0's Bye carries the error the lost peer gave it. The
    trace then blamed rank 0 alone; the launcher's end, kept in the trace, is said first and
    leads the summary's alerts."""
    from zeroscope.state.ending import JobEnd as RecordedEnd
    from zeroscope.state.ending import decode, encode
    from zeroscope.state.report import run_report

    state = _two_ranks_reported()
    now = time.time_ns()
    state.ingest(Bye(rank=1, step=2, wall_ns=now, exit_code=0))
    state.ingest(Bye(rank=0, step=2, wall_ns=now + 1, exit_code=1, message="RuntimeError: reset"))
    end = RecordedEnd(3, rank=1, error="exited with code 3 without a traceback", followers=(0,))
    state.job_end = decode(encode(end))  # as a trace keeps it
    assert state.job_end == end
    lines = summary_lines(state)
    first = lines.index("rank 1 failed first (exit code 3): exited with code 3 without a traceback")
    assert lines[first + 1] == "torchrun then stopped rank 0"
    assert "rank 0 exited with code 1: RuntimeError: reset" in lines[first:]
    assert not any("exited cleanly" in ln for ln in lines)
    alerts = run_report(state)["alerts"]
    assert alerts[0]["detail"].startswith("r1 failed first (exit code 3)")


def test_a_stopped_jobs_trace_says_stopped_not_ended_abruptly() -> None:
    """Ctrl-C: the ranks' Byes need not reach the collector before it stops. Without the
    launcher's end the trace read "no rank said Bye: ... ended abruptly"."""
    from zeroscope.state.ending import JobEnd as RecordedEnd

    state = _two_ranks_reported(4)
    state.flush()
    assert any("ended abruptly" in ln for ln in summary_lines(state))
    state.job_end = RecordedEnd(130, stopped="Ctrl-C")
    lines = summary_lines(state)
    assert "job stopped on request (Ctrl-C) after step 3" in lines
    assert not any("abruptly" in ln or "died" in ln for ln in lines)


def test_a_rank_without_a_bye_is_not_followed_by_all_ranks_exited_cleanly() -> None:
    """Rank 1 ended by ``os._exit(0)`` (no Bye), rank 0 said Bye with 0: the end read "rank 1
    died without a word" and then "all ranks exited cleanly". The summary also names it: its
    alerts left out every ``lost`` one (a finished run's silence is its end)."""
    from zeroscope.state.report import run_report

    state = _two_ranks_reported()
    state.ingest(Bye(rank=0, step=2, wall_ns=time.time_ns(), exit_code=0))
    state.flush()
    lines = summary_lines(state)
    assert "rank r1 died without a word after step 2 (killed or crashed: no Bye)" in lines
    assert "the ranks that said Bye exited cleanly (exit code 0 in each)" in lines
    assert not any("all ranks exited cleanly" in ln for ln in lines)
    details = [a["detail"] for a in run_report(state)["alerts"]]
    assert "r1 died without a word after step 2 (no Bye)" in details


def test_a_syntax_error_in_the_script_is_its_error_line() -> None:
    """Python prints a SyntaxError in the script it runs with no traceback header (the frame,
    the source line, the caret, the exception): the end said "exited with code 1 without a
    traceback" and blamed zeroscope's bootstrap for the silence. A frame-like line a job
    prints itself, with no exception after it, is no error."""
    python = subprocess.run(
        [sys.executable, "-c", "x = ("], capture_output=True, text=True, timeout=60
    )
    assert python.returncode == 1 and "Traceback" not in python.stderr
    scanner = ErrorScanner()
    for line in python.stderr.splitlines():
        scanner.feed(line)
    (error,) = scanner.errors()
    assert error.rank is None and error.line == python.stderr.splitlines()[-1]
    assert error.line.startswith("SyntaxError: ")
    quiet = ErrorScanner()
    for line in ('  File "data.csv", line 3', "loss 0.25 at step 3", "done"):
        assert quiet.feed(line)
    assert quiet.errors() == []
    classified = classify(1, Outcome(exits=(RankExit(rank=0, exitcode=1),)), scanner.errors())
    assert classified.error == error.line


def test_the_final_loss_says_whose_it_is_when_a_rank_is_gone() -> None:
    """Rank 1 died after step 2; rank 0 went on to step 3, whose "rank mean" loss was rank 0's
    alone. The line names it; with every rank in the last step it stays "rank mean"."""
    state = _two_ranks_reported(4)
    state.flush()
    assert any("(rank mean)" in ln for ln in summary_lines(state))
    from tests.fixtures import RunShape, synthetic_run

    state = ClusterState()
    for message in synthetic_run(RunShape(ranks=2, steps=4, overflow_steps=())):
        if not (getattr(message, "rank", 0) == 1 and getattr(message, "step", 0) == 3):
            state.ingest(message)
    state.flush()
    line = next(ln for ln in summary_lines(state) if "final loss" in ln)
    assert "(r0 only: 1 of 2 ranks at step 3)" in line
