"""A hang-up whose SystemExit is lost (the signal landed in a finalizer or a C callback, where
Python prints "Exception ignored" and goes on) still ends zeroscope: the backstop stops the job,
closes the trace and exits with the hang-up's status. The injected fault is a process that
swallows the SystemExit and would otherwise sleep for ever."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

PROGRAM = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from zeroscope.run.hangup import HangUp

    marker = Path(sys.argv[1])
    HangUp(lambda: marker.write_text("stopped"), grace_s=0.5).install()
    try:
        # "ready" is said inside the try: a hang-up sent the moment it is read could otherwise
        # land before the try is entered, and its SystemExit end the program cleanly (exit
        # 129, no marker) before the backstop's grace ran out: the test program's race, seen
        # once on a loaded 2-core box, not the backstop's.
        print("ready", flush=True)
        time.sleep(600)
    except SystemExit:
        pass  # the lost exception: the ordinary stop never runs
    marker.write_text("unwound")  # must not be overwritten by a clean unwind: see below
    time.sleep(600)  # the live view, with nobody to answer it
    """
)


def _started(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    marker = tmp_path / "marker"
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(marker)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc, marker


def test_a_lost_hang_up_exit_is_ended_by_the_backstop(tmp_path: Path) -> None:
    proc, marker = _started(tmp_path)
    try:
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=120) == 128 + signal.SIGHUP
        assert marker.read_text() == "stopped"  # the backstop ran the stop before exiting
    finally:
        proc.kill()


def test_a_second_hang_up_is_ignored_while_stopping(tmp_path: Path) -> None:
    """The shell forwards its own SIGHUP after the terminal's: the second must not kill the
    process before its stop has run."""
    proc, marker = _started(tmp_path)
    try:
        proc.send_signal(signal.SIGHUP)
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=120) == 128 + signal.SIGHUP
        assert marker.read_text() == "stopped"
    finally:
        proc.kill()
