"""Stragglers (a rank that computes longer) and slow links (a rank whose collectives take longer),
judged per step from 2 ranks up.

Under synchronous collectives every rank's step time is the same: the others wait for the slow
rank inside their collectives. So step time says nothing; what differs is how the step splits
into compute and waiting. For rank r in one step:

- compute_r = step_r - wait_r (``StepSummary.compute_s``; wait = time inside collectives)
- compute excess = compute_r - median of the *other* ranks' compute [s]. A straggler has a
  positive excess; the ranks waiting for it have the same excess as waiting time.
- own collective time_r = busy_r - peer lag_r, where busy is the time with a collective in
  flight (``StepSummary.busy_s``) and peer lag = max(0, the slowest other rank's compute -
  compute_r): the part of r's collective time spent waiting for a rank still computing. What
  is left is collective time r spent for reasons of its own.
- link excess = own collective time_r - median of the other ranks' [s]: a slow link. (Inside one synchronous group a slow link slows every member's collectives alike
  and no rank can be singled out; a rank is named when its own collectives are slower than its
  peers', e.g. the members of the one group that crosses a slow link.)

A step is "over" for a rank when an excess exceeds ``AlertRules.straggler_limit_s``:
max(``straggler_min_s``, ``straggler_rel`` x the step's median step time). A rank is flagged
when ``straggler_steps`` of its last ``straggler_window`` judged steps are over, and stays
flagged until they are not; it is named with its median excess over that window and the first
over-step of the run that flagged it.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .alerts import AlertRules
    from .rank import StepSummary

LagKind = Literal["straggler", "slow_link"]


@dataclass(frozen=True, slots=True)
class Standing:
    """One rank in one step, against the other ranks of that step."""

    compute_excess_s: float
    link_excess_s: float
    slowness: float | None
    """compute / median of the others' compute [ratio]; NA when that median is 0."""


def _median_without(values: list[float], value: float) -> float:
    """Median of sorted ``values`` with one occurrence of ``value`` removed (O(log n))."""
    i = bisect.bisect_left(values, value)
    n = len(values) - 1

    def at(k: int) -> float:  # k-th of the remaining n values
        return values[k if k < i else k + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2


def judge(summaries: dict[int, StepSummary]) -> dict[int, Standing]:
    """Every rank's standing in one step (empty below two ranks)."""
    if len(summaries) < 2:
        return {}
    compute = {r: s.compute_s for r, s in summaries.items()}
    cs = sorted(compute.values())
    top, second = cs[-1], cs[-2]
    own = {}
    for r, s in summaries.items():
        slowest_other = second if compute[r] == top else top
        own[r] = s.busy_s - max(0.0, slowest_other - compute[r])
    links = sorted(own.values())
    out = {}
    for r in summaries:
        c = compute[r]
        others = _median_without(cs, c)
        out[r] = Standing(
            compute_excess_s=c - others,
            link_excess_s=own[r] - _median_without(links, own[r]),
            slowness=c / others if others > 0 else None,
        )
    return out


@dataclass(frozen=True, slots=True)
class Finding:
    """A flagged rank: what kind, since which step, by how much."""

    kind: LagKind
    rank: int
    first_step: int
    excess_s: float
    """Median excess over the judged window [s]."""
    slowness: float | None
    """Median compute / the others' median over the same window [ratio] (stragglers)."""


@dataclass(slots=True)
class _Track:
    window: deque[tuple[int, float, float, bool, bool, float | None]]
    """(step, compute excess, link excess, compute over, link over, slowness) of recent judged
    steps."""
    since: dict[str, int] = field(default_factory=dict)
    """kind -> first step of the current flag."""


class LagBook:
    """Per-rank recent standings and the flags they raise."""

    def __init__(self, rules: AlertRules) -> None:
        self.rules = rules
        self._tracks: dict[int, _Track] = {}
        self._flagged: set[int] = set()
        """Ranks with a flag up: findings() reads these, not every rank's track (the alerts
        ask every frame; 16,384 tracks were ~5 ms of it)."""

    def add(self, step: int, standings: dict[int, Standing], median_step_s: float) -> None:
        """Fold in one closed step's standings."""
        rules = self.rules
        limit = rules.straggler_limit_s(median_step_s)
        for r, st in standings.items():
            track = self._tracks.get(r)
            if track is None:
                track = self._tracks[r] = _Track(deque(maxlen=rules.straggler_window))
            over_c, over_l = st.compute_excess_s > limit, st.link_excess_s > limit
            track.window.append(
                (step, st.compute_excess_s, st.link_excess_s, over_c, over_l, st.slowness)
            )
            for kind, index in (("straggler", 3), ("slow_link", 4)):
                overs = [entry[0] for entry in track.window if entry[index]]
                if len(overs) >= rules.straggler_steps:
                    track.since.setdefault(kind, overs[0])
                else:
                    track.since.pop(kind, None)
            if "straggler" in track.since:  # a slow-compute rank is not also a slow link
                track.since.pop("slow_link", None)
            if track.since:
                self._flagged.add(r)
            else:
                self._flagged.discard(r)

    def findings(self) -> list[Finding]:
        """Flagged ranks, the largest excess first."""
        out = []
        for r in self._flagged:
            track = self._tracks[r]
            for kind, since in track.since.items():
                excesses = [e[1] if kind == "straggler" else e[2] for e in track.window]
                median = statistics.median(excesses)
                ratios = [e[5] for e in track.window if e[5] is not None]
                ratio = statistics.median(ratios) if ratios and kind == "straggler" else None
                out.append(Finding(kind, r, since, median, ratio))  # type: ignore[arg-type]
        return sorted(out, key=lambda f: (-f.excess_s, f.rank))
