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
from operator import attrgetter
from typing import TYPE_CHECKING, Literal

import msgspec

from . import columns
from .sequences import peers

if TYPE_CHECKING:
    from collections.abc import Callable

    from .alerts import AlertRules
    from .rank import RankState, StepSummary

LagKind = Literal["straggler", "slow_link"]

_UNEXPOSED = attrgetter("unexposed")
_DURATION = attrgetter("duration_s")
_EXPOSED = attrgetter("exposed_s")
_BUSY = attrgetter("busy_s")


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
    is NA: its wait in collectives was not measured, so no rank can be set against it).

    Worked on arrays (zeroscope.state.columns: a 16,384-rank step's close is ~20 ms of Python
    loops otherwise), each figure the Python expression in the comment beside it, bit for bit."""
    n = len(summaries)
    if n < 2:
        return {}
    values = summaries.values()
    if any(map(_UNEXPOSED, values)):
        return {}  # some rank's compute_s is NA
    np = columns._np()
    duration = columns.floats(values, _DURATION)
    wait = columns.floats(values, _EXPOSED)
    busy = columns.floats(values, _BUSY)
    left = duration - wait
    compute = np.where(left < 0.0, 0.0, left)  # StepSummary.compute_s: max(left, 0.0)
    ranks = list(summaries)
    if columns.has_nan(compute):  # NaN: not sorted under <, so not the sort's order either
        return _judge_in_python(ranks, compute.tolist(), busy.tolist())
    cs = columns.sort(compute)
    top, second = cs[-1], cs[-2]
    lag = np.where(compute == top, second, top) - compute  # the slowest other rank's beyond r's
    own = busy - np.where(lag > 0.0, lag, 0.0)  # max(0.0, lag), NaN kept as it
    if columns.has_nan(own):
        links_list = own.tolist()
        return _judge_bisecting(
            ranks, compute.tolist(), links_list, cs.tolist(), sorted(links_list)
        )
    links = columns.sort(own)
    c_hi, c_lo, c_above, c_mid, c_below = _thresholds(cs.tolist())
    l_hi, l_lo, l_above, l_mid, l_below = _thresholds(links.tolist())
    others = np.where(compute > c_hi, c_above, np.where(compute > c_lo, c_mid, c_below))
    link_others = np.where(own > l_hi, l_above, np.where(own > l_lo, l_mid, l_below))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (compute / others).tolist()
    if not (others > 0.0).all():  # compute / others if others > 0 else None
        for i in np.flatnonzero(~(others > 0.0)).tolist():
            ratio[i] = None
    made = map(Standing, (compute - others).tolist(), (own - link_others).tolist(), ratio)
    return dict(zip(ranks, made, strict=True))


def _judge_in_python(
    ranks: list[int], compute: list[float], busy: list[float]
) -> dict[int, Standing]:
    """:func:`judge` of a step with a NaN compute time, as Python orders it: ``sorted`` leaves
    NaN where the other values put it, and the slowest two ranks are read from that order."""
    cs = sorted(compute)
    top, second = cs[-1], cs[-2]
    own = []
    for b, c in zip(busy, compute, strict=True):
        lag = (second if c == top else top) - c
        own.append(b - (lag if lag > 0.0 else 0.0))
    return _judge_bisecting(ranks, compute, own, cs, sorted(own))


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
            if len(window) == size:
                _, _, _, gone_c, gone_l, _ = window[0]
                track.compute_overs -= gone_c
                track.link_overs -= gone_l
            over_c, over_l = compute > limit, link > limit
            window.append((step, compute, link, over_c, over_l, slowness))
            track.compute_overs += over_c
            track.link_overs += over_l
            since = track.since
            # A kind is flagged while ``need`` of the window's steps are over, from the first
            # over-step in the window when it was raised; a slow-compute rank is not also a
            # slow link.
            if track.compute_overs >= need:
                if "straggler" not in since:
                    since["straggler"] = next(e[0] for e in window if e[3])
                since.pop("slow_link", None)
            else:
                since.pop("straggler", None)
                if track.link_overs >= need:
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
