"""Jobs that start their own ranks, and ranks that leave through ``sys.exit``, under
``zeroscope run`` (agent/attach/spawned.py, agent/exit_status.py).

Oracles: the same script run as its users run it (``python spawn_train.py``: its losses bit for
bit and its exit code), each rank's own process id and parameter bytes (written by the job), and
the status the script exits with. Before: a script spawning its ranks with
``torch.multiprocessing.spawn`` hung in its rendezvous under ``zeroscope run`` (as under plain
torchrun: its ranks inherited ``TORCHELASTIC_USE_AGENT_STORE`` and all waited as clients of a
store nobody served), and its ranks would all have said they were rank 0 of 1; a rank that left
with ``sys.exit(3)`` said exit code 0 in its Bye, and the summary said "all ranks exited
cleanly" above torchrun's "exit code 3"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.attach_support import job_env, read_trace, run_job
from tests.distributed import free_port
from zeroscope.agent.exit_status import ExitStatus
from zeroscope.agent.schema import Bye
from zeroscope.agent.startup import SPAWNED_ENV, identity
from zeroscope.store.trace import TraceReader

SCRIPT = Path(__file__).resolve().parent / "jobs" / "spawn_train.py"
STEPS = 5


def byes(trace: Path) -> dict[int, Bye]:
    with TraceReader(trace) as reader:
        return {m.rank: m for m in reader.messages(kinds=["bye"]) if isinstance(m, Bye)}


def spawn_runs(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], ...]:
    """The script as ``python`` runs it, then under ``zeroscope run`` (no launcher flags)."""
    env = job_env()
    plain = [sys.executable, str(SCRIPT), "--port", str(free_port()), "--out"]
    alone = run_job([*plain, str(tmp_path / "plain"), *extra], env, 180)
    zs = [sys.executable, "-m", "zeroscope", "run", "--headless", "--record"]
    zs += [str(tmp_path / "t.zstrace"), str(SCRIPT), "--port", str(free_port())]
    under = run_job([*zs, "--out", str(tmp_path / "zs"), *extra], env, 300, tmp_path / "t.zstrace")
    return alone, under


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "fork", "process"])
def test_ranks_the_job_spawns_itself_report_as_their_process_groups_ranks(
    tmp_path: Path, method: str
) -> None:
    """(Forked ranks end by ``os._exit``: their last reports, waiting for the Flight Recorder's
    next read, went with the hurried Bye unread before: "2 ranks reported, no step completed".
    ``mp.Process`` ranks, PyTorch's "Writing Distributed Applications" tutorial's, hung in
    their rendezvous as spawned ones did: only ``torch.multiprocessing``'s starter was
    wrapped.)"""
    alone, under = spawn_runs(tmp_path, "--steps", str(STEPS), "--start-method", method)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert under.returncode == 0, under.stderr[-3000:]
    spawner = int(under.stdout.split("spawner ", 1)[1].split()[0])
    trace = read_trace(tmp_path / "t.zstrace")
    assert sorted(r for r in trace if r >= 0) == [0, 1]
    for rank in (0, 1):
        plain = json.loads((tmp_path / f"plain.{rank}").read_text())
        ours = json.loads((tmp_path / f"zs.{rank}").read_text())
        assert ours["losses"] == plain["losses"]  # every bit
        hello = trace[rank].hellos[-1]
        assert (hello.rank, hello.world_size, hello.spawned) == (rank, 2, True)
        assert hello.pid == ours["pid"] != spawner  # the spawned rank itself said it
        assert [s.step for s in trace[rank].steps] == list(range(1, STEPS + 1))
        for report in trace[rank].steps:  # DDP's reducer: all the model's gradients a step
            reduced = sum(c.nbytes for c in report.collectives if c.op == "all_reduce")
            assert reduced == ours["param_bytes"], (rank, report.step)
    assert f"{STEPS} steps on 2 ranks" in under.stdout
    assert all(b.exit_code == 0 for b in byes(tmp_path / "t.zstrace").values())


@pytest.mark.slow
def test_a_spawned_rank_that_raises_says_its_error_and_the_job_fails_as_alone(
    tmp_path: Path,
) -> None:
    alone, under = spawn_runs(tmp_path, "--steps", str(STEPS), "--fail-at", "3")
    assert alone.returncode == 1, alone.stderr[-3000:]
    assert under.returncode == alone.returncode, under.stderr[-3000:]
    said = byes(tmp_path / "t.zstrace")
    # torch's spawn catches the rank's exception, sends its traceback to the parent and calls
    # sys.exit(1): the Bye has that status and the exception it exited of.
    assert (said[1].exit_code, said[1].message) == (1, "RuntimeError: rank 1 broke at step 3")
    assert "rank 1 exited with code 1: RuntimeError: rank 1 broke at step 3" in under.stdout
    # The failure is the job's: torchrun's process 0 is the spawner, not the reporting rank 0.
    assert "the job failed (exit code 1): RuntimeError: rank 1 broke at step 3" in under.stderr
    assert "failed first" not in under.stderr
    assert "exited cleanly" not in under.stdout + under.stderr


EXITS_3 = """
from sys import exit  # taken before the agent starts (at DDP's construction)
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad(); model(torch.randn(4, 8)).sum().backward(); opt.step()
exit(3)
"""


@pytest.mark.slow
def test_ranks_leaving_through_sys_exit_say_its_status(tmp_path: Path) -> None:
    """(``from sys import exit`` at the script's top: the wrapper is in place before it.)"""
    script = tmp_path / "exits_3.py"
    script.write_text(EXITS_3)
    trace = tmp_path / "t.zstrace"
    argv = [sys.executable, "-m", "zeroscope", "run", "--headless", "--nproc-per-node", "2"]
    done = run_job([*argv, "--record", str(trace), str(script)], job_env(), 180, trace)
    assert done.returncode == 3, done.stderr[-3000:]
    said = byes(trace)
    assert sorted(said) == [0, 1]
    assert {(b.exit_code, b.message) for b in said.values()} == {(3, "")}
    assert "exited cleanly" not in done.stdout + done.stderr


# -- the status noted, in one process ----------------------------------------------------------


class Steps:
    n = 1

    def __call__(self) -> int:
        return self.n


@pytest.fixture
def noted(monkeypatch: pytest.MonkeyPatch) -> tuple[ExitStatus, Steps]:
    monkeypatch.setattr(sys, "exit", sys.exit)  # put back after the test
    steps = Steps()
    status = ExitStatus(steps)
    status.install()
    return status, steps


def leave(status: object) -> None:
    with pytest.raises(SystemExit) as raised:
        sys.exit(status)
    assert raised.value.code == status  # the real sys.exit ran, with the same status


def test_the_status_is_what_the_process_exits_with(noted: tuple[ExitStatus, Steps]) -> None:
    status, _ = noted
    assert status.at_exit() == (0, "")
    for given, expected in ((3, (3, "")), (None, (0, "")), (256, (0, "")), (True, (1, ""))):
        leave(given)
        assert status.at_exit() == expected
    leave("no data found")  # Python prints it and exits with 1
    assert status.at_exit() == (1, "no data found")


def test_an_exit_while_handling_an_error_says_the_error_and_a_repeat_keeps_it(
    noted: tuple[ExitStatus, Steps],
) -> None:
    status, _ = noted
    try:
        raise ValueError("loss is nan\nat step 7")
    except ValueError:
        leave(1)
    assert status.at_exit() == (1, "ValueError: loss is nan")
    leave(1)  # multiprocessing's child exits again with its run's status
    assert status.at_exit() == (1, "ValueError: loss is nan")
    leave(2)
    assert status.at_exit() == (2, "")


def test_a_caught_exit_the_job_goes_on_from_and_other_threads_exits_are_forgotten(
    noted: tuple[ExitStatus, Steps],
) -> None:
    status, steps = noted
    leave(4)
    steps.n += 1  # a step ended after it: the job went on
    assert status.at_exit() == (0, "")
    thread = threading.Thread(target=leave, args=(5,))  # would end that thread only
    thread.start()
    thread.join()
    assert status.at_exit() == (0, "")


def test_an_exit_noted_before_the_agent_started_holds_until_a_step_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "exit", sys.exit)
    status = ExitStatus()  # as the attach installs it, before any agent
    status.install()
    wrapped = sys.exit
    status.install()  # once: a second call wraps nothing more
    assert sys.exit is wrapped
    leave(6)
    steps = Steps()
    status.count_steps(steps)  # the agent starts (an exit caught in a setup it went on from)
    assert status.at_exit() == (6, "")
    steps.n += 1
    assert status.at_exit() == (0, "")


# -- who a process is ------------------------------------------------------------------------


class Group:
    """The process group a spawned rank joined (``torch.distributed``'s three calls)."""

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def get_rank() -> int:
        return 3

    @staticmethod
    def get_world_size() -> int:
        return 4


def test_a_spawned_rank_is_its_groups_whatever_its_environment_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch.distributed", Group)
    launcher = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    mark = {SPAWNED_ENV: str(os.getpid() + 1)}  # another process's pid: the spawner's
    # no mark: the launcher's numbers
    assert identity(launcher) == (0, 1, 0, 1, False)
    # spawned, the spawner's environment inherited: the group's numbers, this node's ranks
    assert identity({**launcher, **mark}) == (3, 4, 3, 4, True)
    # spawned by code that set each child's own (accelerate's notebook_launcher): the same
    assert identity({**launcher, **mark, "RANK": "3", "WORLD_SIZE": "4"}) == (3, 4, 3, 4, True)
    # on more than one node: which ranks share one is not known
    assert identity({**launcher, **mark, "GROUP_WORLD_SIZE": "2"}) == (3, 4, 0, 0, True)
    # the spawner itself (the mark is its own pid)
    assert identity({**launcher, SPAWNED_ENV: str(os.getpid())}) == (0, 1, 0, 1, False)


def test_processes_started_from_two_threads_at_once_leave_the_environment_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each start changes the environment its child inherits and puts it back; two threads
    starting at once (a DataLoader's workers beside a pool) each saved what the other had
    changed, and the one to finish last put the children's environment back for good."""
    from zeroscope.agent.attach import spawned

    monkeypatch.setenv(spawned.AGENT_STORE_ENV, "True")
    monkeypatch.delenv(SPAWNED_ENV, raising=False)
    monkeypatch.setattr(spawned, "launcher_process", lambda: False)
    inside = threading.Barrier(2)
    first_done = threading.Event()
    seen: list[tuple[str | None, str | None]] = []

    def start(last: bool) -> None:  # both inside their start, then the first one leaves first
        seen.append((os.environ.get(spawned.AGENT_STORE_ENV), os.environ.get(SPAWNED_ENV)))
        inside.wait(timeout=30)
        if last:
            first_done.wait(timeout=30)

    wrapped = spawned._starting_ranks(start)
    first = threading.Thread(target=wrapped, args=(False,))
    second = threading.Thread(target=wrapped, args=(True,))
    first.start()
    second.start()
    first.join(timeout=60)
    first_done.set()
    second.join(timeout=60)
    assert seen == [(None, str(os.getpid()))] * 2  # each child saw the environment it needs
    assert os.environ.get(spawned.AGENT_STORE_ENV) == "True"  # the job's own is back
    assert SPAWNED_ENV not in os.environ
