"""A stop that reaches the supervised launcher before it started any rank ends it, wherever its
main thread is at that moment.

A clean-clone run once hung here: Ctrl-C while torchrun was still importing torch, and the job
went on to train. The early-stop handler raised an exception into the main thread, and an
``except Exception`` around an optional import swallowed it. The child below sits in exactly such
a block: the stop must still end it with 128 + the signal and the outcome file saying so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zeroscope.run.job_end import Outcome

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import signal, sys, time
from {module} import {handler}
{install}
print("ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:  # what an optional import does: a failure of any kind means "not available"
        time.sleep(0.01)
    except Exception:
        pass
sys.exit(3)  # the stop was swallowed
"""

INSTALLS = {
    "torchrun": (
        "zeroscope.run.torchrun_main",
        "_early_stop_handler",
        "stop = _early_stop_handler(sys.argv[1])\n"
        "for s in (signal.SIGINT, signal.SIGTERM):\n"
        "    signal.signal(s, stop)",
    ),
    "deepspeed": (
        "zeroscope.run.deepspeed_main",
        "_pass_on, _outcome_path",
        "_outcome_path[0] = sys.argv[1]\n"
        "for s in (signal.SIGINT, signal.SIGTERM):\n"
        "    signal.signal(s, _pass_on)",
    ),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("launcher", sorted(INSTALLS))
def test_an_early_stop_is_not_swallowed_by_an_except_exception(
    tmp_path: Path, launcher: str, sig: signal.Signals
) -> None:
    module, handler, install = INSTALLS[launcher]
    outcome = tmp_path / "outcome.json"
    code = CHILD.format(module=module, handler=handler, install=install)
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(outcome)],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(0.05)  # inside the loop's try block
        child.send_signal(sig)
        returncode = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert returncode == 128 + sig
    assert Outcome.load(str(outcome)) == Outcome(signal=int(sig))
