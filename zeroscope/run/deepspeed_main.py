"""``python -m zeroscope.run.deepspeed_main [launcher flags] script [args]``: DeepSpeed's launcher,
supervised.

This is ``deepspeed.launcher.runner.main`` itself (the ``deepspeed`` command: hostfile,
``--include``/``--exclude``, ``--num_gpus``, then ``deepspeed.launcher.launch`` starting the
ranks), with what ``zeroscope run`` needs around it, as :mod:`zeroscope.run.torchrun_main` does
for torchrun:

- it dies with zeroscope (the watchdog pipe of :mod:`zeroscope.run.supervision`);
- a stop (SIGINT/SIGTERM) reaches the ranks: the runner itself only waits on
  ``deepspeed.launcher.launch`` (a SIGINT would end the runner and orphan it), so the signal is
  passed to the runner's children, whose handler stops every rank; the end is then 128 + the
  signal, as a shell reports a stop, and said so in the outcome file.

A failed rank ends ``deepspeed.launcher.launch`` with that rank's exit code, which the runner
passes on; that code is the job's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from types import FrameType

from zeroscope.run.job_end import OUTCOME_ENV, Outcome
from zeroscope.run.supervision import announce_ready, leave_on_stop, watch_parent

_stopped: list[int] = []
_outcome_path: list[str | None] = [None]


def _pass_on(signum: int, frame: FrameType | None) -> None:
    import psutil

    _stopped.append(signum)
    children = psutil.Process().children()
    if not children:  # a stop before the runner started any process: nothing to pass it to
        leave_on_stop(signum, lambda sig: _save(_outcome_path[0], Outcome(signal=sig)))
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.send_signal(signum)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _outcome_path[0] = os.environ.pop(OUTCOME_ENV, None)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _pass_on)
    watch_parent(os.environ)
    announce_ready(os.environ)
    code = _run(argv)
    if _stopped:
        _save(_outcome_path[0], Outcome(signal=_stopped[0]))
        return 128 + _stopped[0]
    return code


def _run(argv: list[str]) -> int:
    from deepspeed.launcher.runner import main as runner_main

    try:
        runner_main(argv)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _save(path: str | None, outcome: Outcome) -> None:
    if path:
        outcome.save(path)


if __name__ == "__main__":
    sys.exit(main())
