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
from math import isnan
from operator import attrgetter
from typing import TYPE_CHECKING, Literal, cast

import msgspec

from .sequences import peers

if TYPE_CHECKING:
    from collections.abc import Callable

    from .alerts import AlertRules
    from .rank import RankState, StepSummary

LagKind = Literal["straggler", "slow_link"]

_COMPUTE = attrgetter("compute_s")


class Standing(msgspec.Struct, frozen=True, gc=False):
    """One rank in one step, against the other ranks of that step. A closed step makes one per
    rank, kept with the step (512 steps of 16,384 ranks: 8 M): a msgspec Struct untracked by
    the garbage collector (``gc=False``: three numbers), where a named tuple, a tuple subclass,
    stayed tracked for good (CPython untracks only exact tuples) and every whole-heap collection
    walked them all; built by msgspec's C ``__init__`` in ~0.1 us instead of ~0.2."""

    compute_excess_s: float
    link_excess_s: float
    slowness: float | None
    """compute / median of the others' compute [ratio]; NA when that median is 0."""


def _medians_without(values: list[float]) -> Callable[[float], float]:
    """For sorted ``values``: the function giving the median of the values with one occurrence
    of ``v`` removed. Removing one value moves the median by at most one place, so there are
    three answers, found once; each rank then costs one bisection."""
    n = len(values) - 1  # the values left
    mid = n // 2
    # at(k), the k-th of the n values left when the one at index i is removed: values[k] for
    # k < i, else values[k + 1].
    if n % 2:
        above, not_above = values[mid], values[mid + 1]  # i > mid, i <= mid

        def odd(v: float) -> float:
            return above if bisect.bisect_left(values, v) > mid else not_above

        return odd
    above = (values[mid - 1] + values[mid]) / 2  # i > mid
    at_mid = (values[mid - 1] + values[mid + 1]) / 2  # i == mid
    below = (values[mid] + values[mid + 1]) / 2  # i < mid

    def even(v: float) -> float:
        i = bisect.bisect_left(values, v)
        return above if i > mid else at_mid if i == mid else below

    return even


def _thresholds(values: list[float]) -> tuple[float, float, float, float, float]:
    """For sorted ``values`` free of NaN, what :func:`_medians_without` answers, as numbers:
    (hi, lo, above, at_mid, below), the median without one ``v`` being ``above if v > hi else
    at_mid if v > lo else below``. The bisection's index of ``v`` is past the middle exactly when
    values[mid] < v, and at it when values[mid - 1] < v <= values[mid] (sorted under ``<``), so
    two comparisons a rank replace a bisection and a closure call (~1 us a rank)."""
    n = len(values) - 1
    mid = n // 2
    if n % 2:
        return values[mid], values[mid], values[mid], values[mid + 1], values[mid + 1]
    return (
        values[mid],
        values[mid - 1],
        (values[mid - 1] + values[mid]) / 2,
        (values[mid - 1] + values[mid + 1]) / 2,
        (values[mid] + values[mid + 1]) / 2,
    )


def judge_by_stage(
    summaries: dict[int, StepSummary], ranks: dict[int, RankState]
) -> dict[int, Standing]:
    """:func:`judge` within each pipeline stage and tensor slice (its data-parallel replicas):
    stages compute different layers by design, which the Pipeline screen weighs (a 2-stage
    demo's stage 1 was called a straggler at 1.68x while its stage imbalance was 1.02x)."""
    groups: dict[tuple[int, int], dict[int, StepSummary]] = {}
    for r, s in summaries.items():
        groups.setdefault(peers(ranks.get(r)), {})[r] = s
    out: dict[int, Standing] = {}
    for group in groups.values():
        out.update(judge(group))
    return out


def judge(summaries: dict[int, StepSummary]) -> dict[int, Standing]:
    """Every rank's standing in one step (empty below two ranks, or when some rank's compute
    is NA: its wait in collectives was not measured, so no rank can be set against it)."""
    if len(summaries) < 2:
        return {}
    ranks = list(summaries)
    measured = list(map(_COMPUTE, summaries.values()))
    if None in measured:
        return {}
    compute = cast("list[float]", measured)
    cs = sorted(compute)
    top, second = cs[-1], cs[-2]
    own = []
    for s, c in zip(summaries.values(), compute):
        lag = (second if c == top else top) - c  # the slowest other rank's compute beyond r's
        own.append(s.busy_s - (lag if lag > 0.0 else 0.0))  # max(0.0, lag), written out
    links = sorted(own)
    if any(map(isnan, cs)) or any(map(isnan, links)):
        return _judge_bisecting(ranks, compute, own, cs, links)  # NaN: not sorted under <
    c_hi, c_lo, c_above, c_mid, c_below = _thresholds(cs)
    l_hi, l_lo, l_above, l_mid, l_below = _thresholds(links)
    out = {}
    for r, c, link in zip(ranks, compute, own):
        others = c_above if c > c_hi else c_mid if c > c_lo else c_below
        link_others = l_above if link > l_hi else l_mid if link > l_lo else l_below
        out[r] = Standing(c - others, link - link_others, c / others if others > 0 else None)
    return out


def _judge_bisecting(
    ranks: list[int], compute: list[float], own: list[float], cs: list[float], links: list[float]
) -> dict[int, Standing]:
    """:func:`judge`'s standings by bisection, for a step with a NaN time among its ranks."""
    compute_others = _medians_without(cs)
    link_others = _medians_without(links)
    out = {}
    for r, c, link in zip(ranks, compute, own):
        others = compute_others(c)
        out[r] = Standing(c - others, link - link_others(link), c / others if others > 0 else None)
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
    compute_overs: int = 0
    link_overs: int = 0
    """Over-steps in ``window`` (kept as entries come and go: a step closes for every rank)."""


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
        need, size = rules.straggler_steps, rules.straggler_window
        tracks = self._tracks
        for r, st in standings.items():
            compute, link, slowness = st.compute_excess_s, st.link_excess_s, st.slowness
            track = tracks.get(r)
            if track is None:
                track = tracks[r] = _Track(deque(maxlen=size))
            window = track.window
            compute_overs, link_overs = track.compute_overs, track.link_overs
            if len(window) == size:
                _, _, _, gone_c, gone_l, _ = window[0]
                compute_overs -= gone_c
                link_overs -= gone_l
            over_c, over_l = compute > limit, link > limit
            window.append((step, compute, link, over_c, over_l, slowness))
            compute_overs = track.compute_overs = compute_overs + over_c
            link_overs = track.link_overs = link_overs + over_l
            since = track.since
            if not since and compute_overs < need and link_overs < need:
                continue  # nothing raised, nothing to raise: a steady rank (most of them)
            # A kind is flagged while ``need`` of the window's steps are over, from the first
            # over-step in the window when it was raised; a slow-compute rank is not also a
            # slow link.
            if compute_overs >= need:
                if "straggler" not in since:
                    since["straggler"] = next(e[0] for e in window if e[3])
                since.pop("slow_link", None)
            else:
                since.pop("straggler", None)
                if link_overs >= need:
                    if "slow_link" not in since:
                        since["slow_link"] = next(e[0] for e in window if e[4])
                else:
                    since.pop("slow_link", None)
            if since:
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
