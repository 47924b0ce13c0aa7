"""How a job ended, in one exit code and a few plain sentences.

Three witnesses, each partial: torchrun knows every failed rank's exit code or signal (it writes
them to the outcome file, :mod:`zeroscope.run.torchrun_main`); the job's output holds each rank's own
exception line, in the order they appeared (:mod:`zeroscope.run.job_errors`); zeroscope knows when it
stopped the job itself. The rules:

- a stop on request (Ctrl-C, ``q`` then stop, SIGTERM) is said as such and exits 128 + signal
  (130 for Ctrl-C and for the TUI's stop), whatever torchrun and the ranks made of it;
- otherwise the first failing rank decides: its exit code (128 + signal when a signal killed
  it) and its own error line. A rank killed by a signal other than SIGTERM failed first (nothing
  a peer does sends SIGKILL or SIGSEGV); torchrun answers the first failure by sending SIGTERM
  to the others, so those are followers; among ranks that raised, the earliest traceback wins.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path

import msgspec

from zeroscope.run.job_errors import RankError
from zeroscope.state.ending import JobEnd, encode
from zeroscope.store.trace import record_job_end

OUTCOME_ENV = "ZEROSCOPE_OUTCOME_FILE"
"""Where the supervised torchrun writes its :class:`Outcome` (JSON)."""


class RankExit(msgspec.Struct, frozen=True, kw_only=True):
    """A failed rank as torchrun saw it."""

    rank: int
    exitcode: int
    """torchrun's: negative when a signal killed the process."""
    local_rank: int = 0

    @property
    def code(self) -> int:
        """As a shell reports it: 128 + signal for a signal death."""
        return self.exitcode if self.exitcode >= 0 else 128 - self.exitcode

    @property
    def signal_name(self) -> str | None:
        if self.exitcode >= 0:
            return None
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """What the supervised torchrun tells zeroscope about the ranks."""

    exits: tuple[RankExit, ...] = ()
    """The ranks that failed (empty: all succeeded, or torchrun was stopped)."""
    signal: int | None = None
    """torchrun itself was stopped by this signal."""

    def save(self, path: str) -> None:
        Path(path).write_bytes(msgspec.json.encode(self))

    @classmethod
    def load(cls, path: str) -> Outcome | None:
        """None when torchrun wrote none (it failed on its own, or never got that far)."""
        try:
            return msgspec.json.decode(Path(path).read_bytes(), type=cls)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            return None


def first_failure(exits: tuple[RankExit, ...], errors: list[RankError]) -> RankExit | None:
    """The rank that failed first (see the module's rules)."""
    if not exits:
        return None
    sigterm = -int(signal.SIGTERM)
    leaders = [e for e in exits if e.exitcode != sigterm] or list(exits)
    killed = [e for e in leaders if e.exitcode < 0]
    if killed:
        return min(killed, key=lambda e: e.rank)
    order = {e.rank: e.seq for e in errors if e.rank is not None}
    return min(leaders, key=lambda e: (order.get(e.rank, 1 << 62), e.rank))


def how_it_ended(
    failed: RankExit, errors: list[RankError], reported: Mapping[int, str] | None = None
) -> str:
    """The rank's own error line, else what killed it, else what its agent reported (its
    output may have gone elsewhere: torchrun's ``--redirects``), else its bare exit code.

    A rank that raised and was then killed by a signal says both, the error first: it is the
    cause, the signal what came of it (torch's gloo teardown can abort a process that leaves
    with its process group still up, turning an exception's exit code 1 into SIGABRT)."""
    own = next((e.line for e in errors if e.rank == failed.rank), None)
    if failed.signal_name:
        killed = f"killed by {failed.signal_name}"
        return f"{own} (then {killed})" if own else killed
    if own is not None:
        return own
    if reported and reported.get(failed.rank):
        return reported[failed.rank]
    # Raised before the process group existed (bad arguments, a config error): torch's
    # ``[rankN]:`` prefix comes with the group, so the traceback is unprefixed. torchrun's own
    # errors never reach here (a failed rank means torchrun ran), so it is a rank's.
    unprefixed = next((e.line for e in errors if e.rank is None), None)
    if unprefixed is not None:
        return unprefixed
    return f"exited with code {failed.code} without a traceback"


def classify(
    returncode: int,
    outcome: Outcome | None,
    errors: list[RankError],
    stopped: str | None = None,
    stop_code: int = 130,
    reported: Mapping[int, str] | None = None,
    *,
    named: bool = True,
) -> JobEnd:
    """The job's end from torchrun's ``returncode`` (negative: killed by that signal), the
    outcome file, the ranks' error lines, zeroscope's own stop (``stopped``: why) and the
    errors the ranks' agents reported (``reported``, rank -> their Bye's message). ``named``:
    torchrun's process numbers are the job's ranks (not so when the job spawned its ranks
    itself: the failure is the job's, said with its error, and no rank is named)."""
    if stopped:
        return JobEnd(stop_code, stopped=stopped)
    code = returncode if returncode >= 0 else 128 - returncode
    if code == 0:
        return JobEnd(0)
    failed = first_failure(outcome.exits, errors) if outcome else None
    if failed is None:
        # torchrun failed by itself (bad flag, rendezvous timeout) or was killed: its own
        # error line is the first unprefixed traceback's, if any.
        first = next((e.line for e in errors), None)
        return JobEnd(code, error=first)
    if not named:
        return JobEnd(failed.code, error=how_it_ended(failed, errors))
    sigterm = -int(signal.SIGTERM)
    followers = tuple(
        e.rank
        for e in (outcome.exits if outcome else ())
        if e.rank != failed.rank and e.exitcode == sigterm
    )
    lines = {e.rank: e.line for e in errors if e.rank is not None}
    first = lines.get(failed.rank)
    return JobEnd(
        failed.code,
        rank=failed.rank,
        error=how_it_ended(failed, errors, reported),
        followers=followers,
        raised=tuple(r for r in followers if first is not None and lines.get(r) == first),
    )


def keep_in_trace(trace: str | Path, end: JobEnd) -> None:
    """Write the job's end into its closed trace (zeroscope.state.ending says why)."""
    record_job_end(trace, encode(end))
