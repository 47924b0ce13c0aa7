"""The throughput figures the screens show (tokens/s, model TFLOP/s, MFU), as computed in one
place (zeroscope.state.throughput), for the rank table, the rank detail and the history plots.

Each returns None when the rank or step reported no ``work`` at all (a trace from before the
figures existed, a pipeline engine): the screens then leave the figures out rather than show
a column of NA; a figure that is reported but not known is None inside the Throughput, with
the reason in ``na``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zeroscope.state.throughput import Throughput, rank_step

if TYPE_CHECKING:
    from zeroscope.state.rank import RankState, StepSummary

__all__ = ["Throughput", "rank_throughput", "summary_mfu", "summary_tokens_per_s"]


def rank_throughput(rs: RankState | None) -> Throughput | None:
    """The rank's newest step's figures (its own step time); None when it reported no work."""
    s = rs.summary if rs is not None else None
    if s is None or s.work is None:
        return None
    return rank_step(s)


def summary_mfu(s: StepSummary) -> float | None:
    """One step's MFU of one rank [fraction] (a plot's point)."""
    return None if s.work is None else rank_step(s).mfu


def summary_tokens_per_s(s: StepSummary) -> float | None:
    """One step's tokens/s of one rank (a plot's point)."""
    return None if s.work is None else rank_step(s).tokens_per_s
