"""The job ``zeroscope run`` launched: supervised torchrun, its output, its stop and its end.

- torchrun runs as :mod:`zeroscope.run.torchrun_main` in its own session (a TUI owning the terminal
  never hands it a stray Ctrl-C) with the watchdog pipe of :mod:`zeroscope.run.supervision`, so it
  and its ranks die with zeroscope, even after ``kill -9``;
- its output goes through :class:`~zeroscope.run.job_relay.OutputRelay`: all of it to the log,
  the ranks' tracebacks read for their error lines;
- a stop on request is remembered, so the end says "stopped" and exits 128 + signal whatever
  torchrun and the ranks made of it; the first stop is SIGINT to torchrun alone (it passes it
  once to each worker's own session), the second kills torchrun and every process under it;
- :meth:`Job.end` classifies the end (:mod:`zeroscope.run.job_end`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import BinaryIO

import psutil

from zeroscope.run.job_end import OUTCOME_ENV, JobEnd, Outcome, classify
from zeroscope.run.job_errors import ErrorScanner
from zeroscope.run.job_relay import OutputRelay
from zeroscope.run.supervision import Watchdog
from zeroscope.state import Alert
from zeroscope.state.ending import end_alerts

OUTPUT_DRAIN_S = 2.0
"""After torchrun exits, how long to wait for the last of its output."""
READY_WAIT_S = 30.0
"""How long a stop waits for torchrun to handle signals (it starts Python and zeroscope's
supervision first: well under a second unless the machine is swamped)."""


class Job:
    """torchrun and, under it, the ranks."""

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log: str | None = None,
        *,
        forward: bool = True,
        terminal: bool = False,
    ) -> None:
        """``log``: file for all of the job's output; ``forward``: show it on zeroscope's own
        stdout/stderr (headless); ``terminal``: a TUI owns zeroscope's terminal, which the
        watchdog gives back if zeroscope is killed."""
        self.argv = argv
        self.log = log
        self.stopped: str | None = None
        """Why zeroscope stopped the job ("Ctrl-C" ...), None while it was not asked to."""
        self.stop_code = 130
        self.scanner = ErrorScanner()
        self.spawned_ranks: Callable[[], bool] = lambda: False
        """Whether the job's ranks were spawned by the job itself (their Hellos say so): the
        launcher's process numbers then name no rank (``classify``'s ``named``)."""
        self._end: JobEnd | None = None
        self._pending: tuple[int, float] | None = None
        """A stop waiting for torchrun to handle signals: (signal, give-up instant)."""
        self._stop_asked = False
        self._outcome: Outcome | None = None
        self._outcome_read = False
        fd, self._outcome_path = tempfile.mkstemp(prefix="zeroscope-outcome-", suffix=".json")
        os.close(fd)
        self._watchdog = Watchdog()
        tty = os.dup(sys.__stdout__.fileno()) if terminal and sys.__stdout__ else None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child_env = {**env, **self._watchdog.child_env(tty), OUTCOME_ENV: self._outcome_path}
        keep = self._watchdog.child_fds + ((tty,) if tty is not None else ())
        try:
            self.process = subprocess.Popen(
                argv,
                env=child_env,
                start_new_session=True,
                stdout=out_w,
                stderr=err_w,
                pass_fds=keep,
            )
        except BaseException:
            for f in (out_r, err_r, out_w, err_w):
                os.close(f)
            raise
        finally:
            self._watchdog.started()
            if tty is not None:
                os.close(tty)
        os.close(out_w)
        os.close(err_w)
        self.relay = OutputRelay(
            out_r,
            err_r,
            log=log,
            forward=forward,
            scanner=self.scanner,
            out=_binary(sys.stdout),
            err=_binary(sys.stderr),
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """torchrun's exit status, None while it runs; delivers a stop that waited for it."""
        self._deliver_pending()
        return self.process.poll()

    # -- stopping ----------------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        """SIGKILL: torchrun and every process under it; any other signal: torchrun alone,
        which handles SIGINT/SIGTERM/SIGHUP/SIGQUIT by passing it to its workers."""
        if sig == signal.SIGKILL:
            self._kill_tree()
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, sig)

    def _kill_tree(self) -> None:
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for proc in [*tree]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)

    def interrupt(self, reason: str = "Ctrl-C", code: int = 130) -> None:
        """A stop on request: the first asks torchrun to stop (SIGINT), a second kills.

        Quick (it runs in signal handlers): a stop that comes before torchrun can take it is
        delivered by the next look at :attr:`returncode`."""
        if self.process.poll() is not None:
            return
        if self._first_stop(reason, code):
            self.scanner.stopping = True
            self._pending = (signal.SIGINT, time.monotonic() + READY_WAIT_S)
            self._deliver_pending()
        else:
            self._pending = None
            self.signal(signal.SIGKILL)

    def _first_stop(self, reason: str, code: int) -> bool:
        """Take a stop request; True for the first. It makes the end "stopped on request"
        unless a rank had already failed on its own: then that failure is what ended the job
        (the user only hurried torchrun's shutdown)."""
        first = not self._stop_asked
        self._stop_asked = True
        failed = any(not e.line.startswith("KeyboardInterrupt") for e in self.scanner.errors())
        if first and not failed:
            self.stopped, self.stop_code = reason, code
        return first

    def _deliver_pending(self) -> None:
        """Send the stop once torchrun handles signals (a second or so after it started); if it
        never does, kill it (nothing was started that needs a gentle end)."""
        if self._pending is None:
            return
        sig, deadline = self._pending
        if self._watchdog.wait_ready(0):
            self._pending = None
            self.signal(sig)
        elif time.monotonic() > deadline:
            self._pending = None
            self.signal(signal.SIGKILL)

    def stop(self, grace_s: float = 10.0, reason: str = "stopped") -> int:
        """Stop on request and wait: SIGINT to torchrun (it stops its workers, waiting up to its
        own shutdown timeout), then, after ``grace_s``, SIGKILL to everything under it. (Not
        SIGTERM to torchrun: mid-shutdown it would abandon its workers.) Returns torchrun's
        exit status."""
        if self.process.poll() is None:
            self._first_stop(reason, 130)
            if self._watchdog.wait_ready(READY_WAIT_S):
                self.signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace_s)
        if self.process.poll() is None:
            self.signal(signal.SIGKILL)
        return self.process.wait()

    # -- the end -------------------------------------------------------------------------------
    def outcome(self) -> Outcome | None:
        """What torchrun said about the ranks (None while it runs, or when it said nothing)."""
        if not self._outcome_read and self.process.poll() is not None:
            self._outcome_read = True
            self._outcome = Outcome.load(self._outcome_path)
            with contextlib.suppress(OSError):
                os.unlink(self._outcome_path)
        return self._outcome

    def end(self, reported: Mapping[int, str] | None = None) -> JobEnd:
        """Wait for torchrun and the last of its output; the job's end, classified
        (``reported``: rank -> the error its agent reported, for ranks whose output went
        elsewhere)."""
        if self._end is None:
            returncode = self.process.wait()
            self.relay.join(OUTPUT_DRAIN_S)
            errors = self.scanner.errors()
            outcome = self.outcome()
            self._end = classify(
                returncode,
                outcome,
                errors,
                self.stopped,
                self.stop_code,
                reported,
                named=not self.spawned_ranks(),
            )
            self._watchdog.close()
        return self._end

    @property
    def ended(self) -> JobEnd | None:
        """The job's end once :meth:`end` has classified it (None before)."""
        return self._end

    def final_code(self) -> int | None:
        """The job's exit code as soon as torchrun has exited (None before); no waiting."""
        returncode = self.process.poll()
        if returncode is None:
            return None
        errors = self.scanner.errors()
        return classify(returncode, self.outcome(), errors, self.stopped, self.stop_code).code

    def exit_code(self) -> int:
        """The job's exit code (see :mod:`zeroscope.run.job_end`)."""
        return self.end().code

    def alerts(self) -> list[Alert]:
        """The failure, as the view shows it: the first rank's error line as soon as it
        appears, then, once torchrun has said how every rank ended, the ranks it stopped."""
        if self.stopped is not None:
            return []
        returncode = self.process.poll()
        if returncode is None:
            errors = self.scanner.errors()
            ranked = [e for e in errors if e.rank is not None] or errors
            if not ranked:
                return []
            e = ranked[0]
            who = f"r{e.rank}" if e.rank is not None else "the job"
            ranks = (e.rank,) if e.rank is not None else ()
            return [Alert("raised", "critical", f"{who} failed: {e.line}", ranks)]
        end = classify(
            returncode, self.outcome(), self.scanner.errors(), named=not self.spawned_ranks()
        )
        return end_alerts(end)


def _binary(stream: object) -> BinaryIO | None:
    return getattr(stream, "buffer", None)
