"""How a job launched by ``zeroscope run`` ended, as the launcher saw it: one exit code, the rank
that failed first and how, or zeroscope's own stop (zeroscope.run.job_end classifies it from
torchrun's outcome file and the ranks' error lines).

It is kept in the trace (its meta table's ``job_end``, zeroscope.store.trace) because the ranks'
own Byes cannot tell it: a Bye leaves from the agent's exit hook, which sees neither the code a
``sys.exit(3)`` gives (a Bye of 0: the trace then blamed the peer whose connection it reset),
nor a rank killed or ending by ``os._exit`` (no Bye), nor a stop on request (the ranks' Byes may
not reach the collector before it stops). Readers of the trace (summary, replay) say what the
launcher said, and the Byes add what each rank reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from .alerts import Alert


@dataclass(frozen=True, slots=True)
class JobEnd:
    """The job's end: its exit code (0, a failed rank's own, or 128 + signal) and why."""

    code: int
    stopped: str | None = None
    """Why zeroscope stopped the job ("Ctrl-C", ...), or None."""
    rank: int | None = None
    """The first failing rank, when known."""
    error: str | None = None
    """Its own error line, or how it died ("killed by SIGKILL")."""
    followers: tuple[int, ...] = field(default=())
    """Ranks torchrun stopped (SIGTERM) after the first failure."""
    raised: tuple[int, ...] = field(default=())
    """Of the followers, those that had raised the first failure's own error before torchrun
    stopped them (a config check every rank runs fails on every rank). A follower's different
    error (a peer gone: gloo's "Connection closed by peer") is a consequence: left to the log."""

    def sentences(self, log: str | None = None) -> list[str]:
        """What to print at the end (before ``job exit code N``)."""
        if self.stopped:
            return [f"job stopped on request ({self.stopped})"]
        if self.code == 0:
            return []
        out = []
        if self.rank is not None:
            out.append(f"rank {self.rank} failed first (exit code {self.code}): {self.error}")
            if self.raised:
                said = ", ".join(str(r) for r in self.raised[:8])
                more = f" and {len(self.raised) - 8} more" if len(self.raised) > 8 else ""
                s, them = ("s", "them") if len(self.raised) > 1 else ("", "it")
                out.append(
                    f"rank{s} {said}{more} raised the same error too; torchrun then stopped {them}"
                )
            quiet = [r for r in self.followers if r not in self.raised]
            if quiet:
                ranks = ", ".join(str(r) for r in quiet[:8])
                more = f" and {len(quiet) - 8} more" if len(quiet) > 8 else ""
                s = "s" if len(quiet) > 1 else ""
                out.append(f"torchrun then stopped rank{s} {ranks}{more}")
        elif self.error:
            out.append(f"the job failed (exit code {self.code}): {self.error}")
        else:
            out.append(f"the job failed (exit code {self.code})")
        if log:
            out.append(f"the job's full output: {log}")
        return out


def end_alerts(end: JobEnd | None) -> list[Alert]:
    """A failed end as alerts: the first failing rank, and the ranks torchrun stopped."""
    if end is None or end.code == 0 or end.stopped:
        return []
    if end.rank is None:
        tail = f": {end.error}" if end.error else ""
        return [Alert("job", "critical", f"the job failed (exit code {end.code}){tail}")]
    kind = "killed" if (end.error or "").startswith("killed by ") else "raised"
    out = [
        Alert(
            kind,
            "critical",
            f"r{end.rank} failed first (exit code {end.code}): {end.error}",
            (end.rank,),
        )
    ]
    for ranks, what in (
        (end.raised, f"raised the same error, then stopped by torchrun after r{end.rank}"),
        (
            tuple(r for r in end.followers if r not in end.raised),
            f"stopped by torchrun after r{end.rank} failed",
        ),
    ):
        if ranks:
            shown = ",".join(f"r{r}" for r in ranks[:6])
            more = f" +{len(ranks) - 6}" if len(ranks) > 6 else ""
            out.append(Alert("killed", "critical", f"{shown}{more} {what}", ranks))
    return out


def encode(end: JobEnd) -> str:
    """The trace's ``job_end`` (JSON)."""
    return msgspec.json.encode(end).decode()


def decode(raw: str | None) -> JobEnd | None:
    """A trace's ``job_end``; None when absent or unreadable (a trace from ``serve``, an older
    zeroscope, a job whose launcher never ended)."""
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=JobEnd)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
