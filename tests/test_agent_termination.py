"""SIGTERM (torchrun stopping the survivors of a failed rank) sends a Bye, and the rank still
dies of SIGTERM: against a real collector, with rank 0 hung in a gloo all-reduce whose peer
never comes (a Python signal handler alone would never run there), and against the same job
without zeroscope (the exit the user sees is unchanged)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from tests.distributed import free_port
from zeroscope.agent import api
from zeroscope.agent.schema import Bye, Message
from zeroscope.agent.termination import STOP_CODE
from zeroscope.collector.server import Collector, wait_for
from zeroscope.state.alerts import interrupted

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

JOB = """
import os, signal, sys, time
mode = sys.argv[1]
if mode == "user-handler":
    signal.signal(signal.SIGTERM, lambda s, f: print("the user's handler ran", flush=True))
import torch, torch.distributed as dist
from zeroscope.agent import api
from zeroscope.agent.schema import MemoryBytes
tel = api.telemetry()
tel.step_end(memory=MemoryBytes(params=7))
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2)
if mode == "fork":
    child = os.fork()
    if child == 0:  # a DataLoader worker's life: terminated by its parent
        time.sleep(60)
        os._exit(0)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
if mode == "closing" and rank == 0:
    # A peer's death raises here first; torchrun's SIGTERM comes while the error's Bye is
    # being said (the agent's close, from its excepthook): sent at the close's first step.
    stop = tel.sampler.stop
    def terminated_while_closing(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)
        return stop(*args, **kwargs)
    tel.sampler.stop = terminated_while_closing
    raise RuntimeError("Connection reset by peer")
print("ready", flush=True)
if rank == 1:
    time.sleep(60)  # the peer that never comes to the all-reduce
elif mode == "user-handler":
    time.sleep(3)  # the user's handler runs and the job goes on
    print("went on", flush=True)
else:
    dist.all_reduce(torch.ones(4))  # hung in C++ until SIGTERM
"""


def start(mode: str, rank: int, port: int, address: str | None) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    env.pop(api.COLLECTOR_ENV, None)
    if address is not None and rank == 0:
        env[api.COLLECTOR_ENV] = address
    return subprocess.Popen(
        [sys.executable, "-c", JOB, mode], env=env, stdout=subprocess.PIPE, text=True
    )


@contextlib.contextmanager
def two_ranks(mode: str, address: str | None) -> Iterator[list[subprocess.Popen[str]]]:
    """The job's two ranks in ``mode`` (rank 0 reporting to ``address``), killed at the end."""
    port = free_port()
    procs = [start(mode, r, port, address) for r in (0, 1)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def terminate_rank0(mode: str, address: str | None) -> tuple[int, float, str]:
    """Rank 0's exit status, seconds from SIGTERM to its end, and its output."""
    with two_ranks(mode, address) as procs:
        stdout = procs[0].stdout
        assert stdout is not None
        lines = []
        for line in stdout:
            lines.append(line)
            if line.startswith("ready"):
                break
        time.sleep(0.5)  # well inside the all-reduce
        t0 = time.monotonic()
        procs[0].send_signal(signal.SIGTERM)
        code = procs[0].wait(timeout=30)
        took = time.monotonic() - t0
        return code, took, "".join(lines) + stdout.read()


def with_collector(run: Callable[[str], T]) -> tuple[T, list[Bye]]:
    """``run(address)`` against a real collector: its result and the Byes the collector got."""
    got: list[Message] = []
    col = Collector()
    col.add_listener(got.append)
    with col:
        result = run(col.ingest_address)
        assert wait_for(lambda: any(isinstance(m, Bye) for m in got))
    return result, [m for m in got if isinstance(m, Bye)]


def user_handler_job(address: str) -> tuple[int, str]:
    """SIGTERM to a rank whose script set its own handler: its exit code and its output."""
    with two_ranks("user-handler", address) as procs:
        out = procs[0].stdout
        assert out is not None
        assert out.readline().startswith("ready")
        procs[0].send_signal(signal.SIGTERM)
        return procs[0].wait(timeout=30), out.read()


@pytest.mark.slow
def test_a_rank_hung_in_a_collective_says_bye_on_sigterm_and_dies_of_it() -> None:
    bare_code, bare_took, _ = terminate_rank0("hung", None)
    (code, took, _), byes = with_collector(lambda address: terminate_rank0("hung", address))
    assert bare_code == code == -signal.SIGTERM  # what the user (and torchrun) sees: unchanged
    assert took < 5 and bare_took < 5
    (bye,) = byes
    assert bye.exit_code == STOP_CODE == 143 and bye.step == 1
    assert interrupted(bye.message) == "SIGTERM"


def closing_job(address: str) -> int:
    """Rank 0 raises, and SIGTERM comes while its agent says the error's Bye: its exit code."""
    with two_ranks("closing", address) as procs:
        return procs[0].wait(timeout=30)


@pytest.mark.slow
def test_a_sigterm_during_the_errors_bye_lets_it_leave_then_ends_the_rank() -> None:
    # Before: the SIGTERM's own Bye found the agent closed and ended the process at once, and
    # the main thread's handler held the close it interrupted: no Bye at all (a CI run's
    # killed-rank test then read "no rank said Bye" instead of the rank that died).
    code, byes = with_collector(closing_job)
    assert code == -signal.SIGTERM  # it still dies of the signal, as without zeroscope
    assert [(b.exit_code, b.message) for b in byes] == [
        (1, "RuntimeError: Connection reset by peer")
    ]


@pytest.mark.slow
def test_the_users_own_sigterm_handler_is_left_alone() -> None:
    (code, out), byes = with_collector(user_handler_job)
    assert code == 0 and "the user's handler ran" in out and "went on" in out
    assert [b.exit_code for b in byes] == [0]  # the job ended normally; no SIGTERM Bye


@pytest.mark.slow
def test_a_forked_child_terminated_by_its_parent_is_not_the_rank_terminated() -> None:
    (code, _, out), byes = with_collector(lambda address: terminate_rank0("fork", address))
    assert "ready" in out  # the parent lived on after its child's SIGTERM
    assert "child -15" in out  # the child died of its SIGTERM, as without zeroscope
    assert code == -signal.SIGTERM
    assert [(b.rank, b.exit_code) for b in byes] == [(0, STOP_CODE)]  # once, for the rank
