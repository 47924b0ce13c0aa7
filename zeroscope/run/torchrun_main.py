"""``python -m zeroscope.run.torchrun_main [torchrun flags] script [args]``: torchrun, supervised.

This is ``torch.distributed.run`` itself (its parser, its ``run()``: rendezvous, restarts and
signal handling stay torchrun's), with three things around it that ``zeroscope run`` needs:

- it dies with zeroscope: a watchdog thread (:mod:`zeroscope.run.supervision`) notices zeroscope's
  end even after ``kill -9``, gives the terminal back, and stops torchrun (SIGTERM, which
  torchrun turns into stopping its workers);
- it says how the ranks ended: torchrun's ``ChildFailedError`` knows every failed rank's exit
  code or signal, and which ones torchrun itself terminated; that goes to the outcome file
  (:mod:`zeroscope.run.job_end`) instead of a traceback and a banner on the terminal;
- a stop on request (SIGINT/SIGTERM) ends quietly with 128 + the signal, as a shell reports it;
- no worker outlives it, whichever way it ends.

Any other torchrun error (a bad flag, a rendezvous timeout) is torchrun's to print, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

from zeroscope.run.job_end import OUTCOME_ENV, Outcome, RankExit
from zeroscope.run.supervision import announce_ready, leave_on_stop, watch_parent


def _early_stop_handler(outcome_path: str | None) -> Callable[[int, FrameType | None], None]:
    """SIGINT/SIGTERM before torchrun installed its own handlers (just before it starts the
    workers, so none exists yet): the outcome says so and torchrun_main leaves at once."""

    def stop(signum: int, frame: FrameType | None) -> None:
        _kill_leftover_workers()  # none expected; and none outlives torchrun_main
        leave_on_stop(signum, lambda sig: _save(outcome_path, Outcome(signal=sig)))

    return stop


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    outcome_path = os.environ.pop(OUTCOME_ENV, None)
    # Until torchrun registers its handlers (just before it starts the workers), a stop is
    # ours to handle. Setting a handler also undoes an inherited SIG_IGN (a job started from
    # a script's background), which the workers would otherwise inherit through exec and
    # then ignore torchrun's SIGINT.
    early_stop = _early_stop_handler(outcome_path)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, early_stop)
    watch_parent(os.environ)
    announce_ready(os.environ)
    try:
        return _run(argv, outcome_path)
    finally:
        _kill_leftover_workers()


def _kill_leftover_workers() -> None:
    """No worker outlives torchrun. A second stop signal during torchrun's shutdown (SIGTERM
    from the watchdog while it waits for the workers after a SIGINT) makes it leave that wait
    and return without the SIGKILL that ends it, abandoning any worker that had not stopped yet
    (one stuck in a collective, or one that ignores SIGINT): kill those now."""
    try:
        import psutil

        left = psutil.Process().children(recursive=True)
    except Exception:
        return
    for proc in left:
        with contextlib.suppress(Exception):
            proc.kill()


def _run(argv: list[str], outcome_path: str | None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as exc:
        failed = sorted(exc.failures.items())
        exits = tuple(
            RankExit(rank=r, exitcode=f.exitcode, local_rank=f.local_rank) for r, f in failed
        )
        _save(outcome_path, Outcome(exits=exits))
        return 1  # torchrun's own code for a failed worker group
    except SignalException as exc:
        _save(outcome_path, Outcome(signal=int(exc.sigval)))
        return 128 + int(exc.sigval)
    _save(outcome_path, Outcome())
    return 0


def _save(path: str | None, outcome: Outcome) -> None:
    if path:
        outcome.save(path)


if __name__ == "__main__":
    sys.exit(main())
