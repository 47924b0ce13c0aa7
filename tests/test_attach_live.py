"""End to end through a real sshd on 127.0.0.1: a 2-rank torchrun job under ``zeroscope serve``,
``zeroscope attach --headless`` lists it, tunnels to it, prints its steps live, survives the
tunnel being killed (the catch-up fills the gap: no step missing), and ends with the job.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from tests.sshd import Sshd, sshd_available, start_sshd
from zeroscope.remote.ssh import free_port
from zeroscope.store.trace import TraceReader

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not sshd_available(), reason="needs OpenSSH server and client"),
]

JOB = Path(__file__).parent / "jobs" / "paced_job.py"
STEP_LINE = re.compile(r"^step\s+(\d+)\s.*ranks (\d+)")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


class Lines:
    """Collects a process's output lines on a thread, for waiting on them."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pred: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for line in self.lines[seen:]:
                if pred(line):
                    return line
            seen = len(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; got:\n" + "\n".join(self.lines[-30:]))

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _steps(lines: list[str]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for line in lines if (m := STEP_LINE.match(line))]


def _wait_trace_step(trace: Path, step: int, timeout: float) -> int:
    """Wait until the job's trace holds ``step``; its last recorded step then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with TraceReader(trace) as reader:
            steps = reader.steps()
        if steps is not None and steps[1] >= step:
            return steps[1]
        time.sleep(0.1)
    raise AssertionError(f"the job did not reach step {step} within {timeout} s")


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
    proc.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_attach_follows_live_job_and_survives_tunnel_drop(sshd: Sshd, tmp_path: Path) -> None:
    home = tmp_path / "zhome"
    env = {**os.environ, "ZEROSCOPE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    stop = tmp_path / "stop"
    trace = tmp_path / "job.zstrace"
    serve = subprocess.Popen(
        [sys.executable, "-m", "zeroscope", "serve", "--record", str(trace), "--",
         sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(JOB), str(stop), "0.05"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    serve_out = Lines(serve.stdout)
    attach: subprocess.Popen[str] | None = None
    try:
        started = serve_out.wait_for(lambda s: s.startswith("zeroscope serve: job"), 20, "serve")
        job_id = started.split()[3].rstrip(",")
        listed = subprocess.run(
            [sys.executable, "-m", "zeroscope", "attach", sshd.target,
             *sshd.client_options(home=home), "--list"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[1].split()[:3] == [job_id, "running", "serve"]
        attach = subprocess.Popen(
            [sys.executable, "-m", "zeroscope", "attach", sshd.target,
             *sshd.client_options(home=home), "--headless"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if k != "ZEROSCOPE_HOME"},
        )  # fmt: skip
        out, err = Lines(attach.stdout), Lines(attach.stderr)
        err.wait_for(lambda s: "tunnel tcp://127.0.0.1:" in s, 30, "the tunnel")
        out.wait_for(lambda s: bool((m := STEP_LINE.match(s)) and int(m[1]) >= 3), 60, "step 3")

        # Kill the tunnel (the ssh child of attach): attach must rebuild it.
        tunnels = [
            p
            for p in psutil.Process(attach.pid).children()
            if "-N" in p.cmdline() and p.name() == "ssh"
        ]
        assert len(tunnels) == 1, [p.cmdline() for p in psutil.Process(attach.pid).children()]
        seen_before = max(s for s, _ in _steps(out.lines))
        # Hold sshd still while the tunnel is down, so the job runs steps no live update can
        # carry: after the rebuild only the catch-up ("everything since N") can bring them.
        server = psutil.Process(sshd.proc.pid)  # type: ignore[union-attr]
        server.suspend()
        try:
            tunnels[0].kill()
            err.wait_for(lambda s: "tunnel dropped" in s, 15, "the drop to be noticed")
            gap_end = _wait_trace_step(trace, seen_before + 5, 30)
        finally:
            server.resume()
        err.wait_for(lambda s: "tunnel restored" in s, 30, "the tunnel to be rebuilt")
        out.wait_for(
            lambda s: bool((m := STEP_LINE.match(s)) and int(m[1]) >= seen_before + 5),
            60,
            "steps after the reconnect",
        )
        stop.touch()
        assert attach.wait(timeout=60) == 0, "\n".join(err.lines)
        assert serve.wait(timeout=30) == 0, "\n".join(serve_out.lines)
        out.join(5)
    finally:
        stop.touch()
        if attach is not None:
            _kill(attach)
        _kill(serve)

    # Attaching again after the end points at the trace instead.
    again = subprocess.run(
        [sys.executable, "-m", "zeroscope", "attach", sshd.target, *sshd.client_options(home=home)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert again.returncode == 2
    assert f"job {job_id} on 127.0.0.1 already finished" in again.stderr
    assert f"{trace} ." in again.stderr and "zeroscope replay job.zstrace" in again.stderr

    steps = _steps(out.lines)
    numbers = [s for s, _ in steps]
    # Every step exactly once, in order, each with both ranks: nothing lost in the drop.
    assert numbers == list(range(numbers[0], numbers[-1] + 1)) and numbers[0] <= 1, numbers
    assert all(ranks == 2 for _, ranks in steps)
    assert numbers[-1] > gap_end > seen_before + 4
    with TraceReader(trace) as reader:
        assert reader.steps() == (numbers[0], numbers[-1])
    assert any(line.startswith("job ") for line in out.lines)  # the summary
    assert oct(trace.stat().st_mode & 0o777) == "0o600"
