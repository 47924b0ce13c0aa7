"""Alerts: the few conditions a person watching a ZeRO job must not miss, computed from
ClusterState. One Alert per condition (listing the ranks it hits), so the strip stays readable
at 1024 ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from .relays import relay_outages_of
from .roster import headcount, missing_summary

if TYPE_CHECKING:
    from .cluster import ClusterState

Severity = Literal["warning", "critical"]

Level = Literal["ok", "warn", "bad", "na"]
"""A figure's judgement, from :class:`AlertRules`: views map it to a colour and nothing else.
``na``: the figure (or what it is judged against) was not measured."""

HEAT_METRICS = ("slowness", "memory", "exposed", "step")
"""The heatmap's metrics; ``memory`` and ``step`` are judged as shares of the largest rank's."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Thresholds:
    """When an advisor rule speaks (zeroscope.state.advice; ``AlertRules.advice`` holds the ones
    in force, listed in the help beside the colours'). They judge what a change would buy, not
    a figure's colour: the advisor's bubble rule measures against the schedule's 1F1B bound
    (the floor any schedule reaches), the Pipeline screen's colour against the schedule's own
    plan (``AlertRules.bubble_excess``)."""

    exposed_share_min: float = 0.15
    """Rule 1: exposed all-gathers (or per-micro-step reductions) above this share of the step
    make a lower stage worth its memory."""
    fit_fraction: float = 0.8
    """A change that adds memory is advised only if peak use after it stays under this
    fraction of the device's memory."""
    prefetch_wait_max: float = 0.15
    """Rule 3: time waiting in parameter fetch / compute above this: prefetch too small."""
    prefetch_wait_min: float = 0.05
    """Rule 3: below this with low headroom: prefetch larger than it needs to be."""
    pressure: float = 0.8
    """Advice that only saves memory speaks when peak use is above this fraction of it."""
    latency_share_min: float = 0.5
    """Rule 2: an op whose time is more than this share per-collective latency is
    latency-bound."""
    op_share_min: float = 0.05
    """Rules 2 and 4: an op's exposed time must be at least this share of the step."""
    skipped_min: float = 0.02
    """Rule 5: skipped (overflowing) steps above this share, after the scale settled."""
    startup_skipped_min: int = 5
    """Rule 5 at start-up: this many skipped steps before the first applied one are a storm
    (DeepSpeed's default start, 2^16, calibrates in a few steps on most models)."""
    activations_share_min: float = 0.5
    """Rule 6: activations above this share of P+G+O+A dominate the peak."""
    bubble_excess: float = 0.05
    """Rule 12: a measured bubble this far above the 1F1B bound (a share of the step)."""
    bubble_bound_max: float = 0.25
    """Rule 12: a 1F1B bound itself above this share of the step: too few micro-batches for the
    stages, whatever was measured."""
    stage_imbalance: float = 1.2
    """Rule 12: the slowest stage's compute above this multiple of the mean stage's."""

    def lines(self) -> list[str]:
        """The advisor's thresholds in words, for the help screen (three short lines)."""
        return [
            f"advisor      gathers exposed > {self.exposed_share_min:.0%}; memory > "
            f"{self.pressure:.0%} used, fits < {self.fit_fraction:.0%}; prefetch "
            f"{self.prefetch_wait_min:.0%}-{self.prefetch_wait_max:.0%}",
            f"             latency > {self.latency_share_min:.0%}, op exposed >= "
            f"{self.op_share_min:.0%}; fp16 skips > {self.skipped_min:.0%} "
            f"({self.startup_skipped_min} at start); A > {self.activations_share_min:.0%}",
            f"             bubble > 1F1B bound + {self.bubble_excess:.0%} or bound > "
            f"{self.bubble_bound_max:.0%}; a stage > {self.stage_imbalance:.2f}x the mean",
        ]


@dataclass(kw_only=True, slots=True)
class AlertRules:
    """Thresholds; the defaults are what the issue asks for."""

    headroom_min: float = 0.10
    """Device memory headroom below this fraction of the device's total is an alert."""
    host_available_min: int = 1_000_000_000
    """Host memory available below this many bytes is an alert (offload lives there)."""
    storm_overflows: int = 3
    storm_window: int = 10
    """k overflow steps within the last w steps is an overflow storm."""
    straggler_min_s: float = 0.010
    straggler_rel: float = 0.10
    """A step is "over" for a rank when its compute (or link) excess over the other ranks is
    above max(straggler_min_s, straggler_rel x the step's median step time)."""
    straggler_window: int = 5
    straggler_steps: int = 3
    """A rank is flagged when straggler_steps of its last straggler_window steps are over."""
    exposed_max: float = 0.30
    """The cluster's exposed share (the least-exposed rank's) above this, averaged over the
    last straggler_window steps, is an alert."""
    silent_s: float = 2.0
    missing_after_s: float = 10.0
    """A rank of the job (world size from the Hellos) that has not reported this long after the
    first Hello is named, with the reason (state/roster.py). Nodes start within seconds of each
    other: torchrun's rendezvous waits for all of them."""

    slowness_warn: float = 1.05
    slowness_bad: float = 1.20
    """A rank's slowness (its step time over the other ranks' median) above these is a warning /
    bad in the rank table (an instant figure, unlike the straggler alert's run of steps)."""
    bubble_excess: float = 0.10
    """A pipeline stage's measured bubble more than this share of the step above its schedule's
    planned bubble is bad."""
    traffic_tolerance: float = 0.10
    """Measured / predicted communication volume within 1 ± this is the traffic model met."""
    memory_tolerance: float = 0.10
    """A model-state part measured more than this fraction off the formulas' prediction is bad."""
    slowness_severe: float = 1.30
    """The heatmap's hottest slowness band starts here (its cooler cuts are slowness_warn and
    slowness_bad: the table and the heatmap read one scale)."""
    relative_bands: tuple[float, float, float] = (0.7, 0.85, 0.95)
    """The heatmap's cuts for memory and step time, as shares of the largest rank's."""
    advice: Thresholds = field(default_factory=Thresholds)
    """The advisor's rules' thresholds (what a change must buy to be advised)."""

    def straggler_limit_s(self, median_step_s: float) -> float:
        """The straggler and slow-link alerts' own rule, apart from the slowness colours: a
        rank's compute (or link) excess over the other ranks above this many seconds makes a
        step "over" (a run of them raises the alert, ``straggler_steps`` of
        ``straggler_window``). Absolute and relative, so jitter on a short step names nobody."""
        return max(self.straggler_min_s, self.straggler_rel * median_step_s)

    def heat_cuts(self, metric: str) -> tuple[float, float, float]:
        """The heatmap's three cuts for ``metric`` (band 0 at or below the first, band 3 above
        the last): slowness on the table's scale; exposed share in thirds of the exposed alert's
        threshold; memory and step time relative to the largest rank's."""
        if metric == "slowness":
            return (self.slowness_warn, self.slowness_bad, self.slowness_severe)
        if metric == "exposed":
            third = self.exposed_max / 3
            return (third, 2 * third, self.exposed_max)
        return self.relative_bands

    def slowness_level(self, slowness: float | None) -> Level:
        if slowness is None:
            return "na"
        if slowness > self.slowness_bad:
            return "bad"
        return "warn" if slowness > self.slowness_warn else "ok"

    def exposed_level(self, share: float | None) -> Level:
        """A rank's exposed share of its step: above ``exposed_max`` (the cluster alert's
        threshold) is bad."""
        if share is None:
            return "na"
        return "bad" if share > self.exposed_max else "ok"

    def bubble_level(self, measured: float | None, planned: float | None) -> Level:
        """A stage's measured bubble against its schedule's plan; NA when either is."""
        if measured is None or planned is None:
            return "na"
        return "bad" if measured > planned + self.bubble_excess else "ok"

    def traffic_level(self, ratio: float | None) -> Level:
        """Measured / predicted communication volume."""
        if ratio is None:
            return "na"
        tol = self.traffic_tolerance
        return "ok" if 1 - tol <= ratio <= 1 + tol else "warn"

    def memory_level(self, deviation: float | None) -> Level:
        """A part's (measured - predicted) / predicted."""
        if deviation is None:
            return "na"
        return "bad" if abs(deviation) > self.memory_tolerance else "ok"

    def heat_levels(self, metric: str, values: list[float | None]) -> list[int | None]:
        """The heatmap band (0-3) of each rank's ``metric``; None where NA. Memory and step
        are judged as a share of the largest rank's value."""
        top = max((v for v in values if v is not None), default=0.0)
        cuts = self.heat_cuts(metric)
        out: list[int | None] = []
        for value in values:
            if value is not None and metric not in ("slowness", "exposed"):
                value = value / top if top > 0 else 0.0
            out.append(None if value is None else sum(value > c for c in cuts))
        return out

    def thresholds(self) -> list[str]:
        """The judgements' thresholds in words, for the help screen: the numbers the colours
        follow, from this one place."""
        heat = {m: self.heat_cuts(m) for m in HEAT_METRICS}
        return [
            f"slow         yellow > {self.slowness_warn:.2f}x, red > {self.slowness_bad:.2f}x "
            "the other ranks' median",
            f"exposed      red > {self.exposed_max:.0%} of the step (the alert too)",
            f"bubble       red > the schedule's plan + {self.bubble_excess:.0%} of the step",
            f"traffic      green within {1 - self.traffic_tolerance:.2f}-"
            f"{1 + self.traffic_tolerance:.2f}x of the predicted volume",
            f"memory       red > ±{self.memory_tolerance:.0%} off the formulas' prediction",
            f"straggler    alert: excess > max({self.straggler_min_s * 1e3:.0f} ms, "
            f"{self.straggler_rel:.0%} of the median step) in {self.straggler_steps} of "
            f"{self.straggler_window} steps",
            "heatmap      slowness "
            + " / ".join(f"{c:.2f}x" for c in heat["slowness"])
            + ", exposed "
            + " / ".join(f"{c:.0%}" for c in heat["exposed"])
            + ", memory and step "
            + " / ".join(f"{c:.0%}" for c in heat["memory"])
            + " of the largest",
            *self.advice.lines(),
        ]

    def __post_init__(self) -> None:
        if self.storm_overflows < 1 or self.storm_window < self.storm_overflows:
            raise ValueError("storm_overflows must be >= 1 and <= storm_window")
        if not 1 <= self.straggler_steps <= self.straggler_window:
            raise ValueError("straggler_steps must be >= 1 and <= straggler_window")


@dataclass(frozen=True, slots=True)
class Alert:
    """One standing condition. ``message`` is the one-line detail; ``first_step`` the step it
    started at, where known."""

    kind: str
    severity: Severity
    message: str
    ranks: tuple[int, ...] = ()
    first_step: int | None = None

    def as_dict(self) -> dict[str, object]:
        """The JSON shape of ``zeroscope summary --json`` and ``export``."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "ranks": list(self.ranks),
            "first_step": self.first_step,
            "detail": self.message,
        }


STOPS = ("KeyboardInterrupt", "SIGTERM")
"""How a Bye that was stopped from outside begins: Ctrl-C, or SIGTERM (agent/termination.py:
the launcher ending the job after another rank failed, a scheduler's preemption)."""


def interrupted(bye_message: str) -> str | None:
    """What stopped a rank that did not fail by itself (Ctrl-C, SIGTERM), or None."""
    return next((stop for stop in STOPS if bye_message.startswith(stop)), None)


def ranks_text(ranks: list[int], named: int = 6) -> str:
    """``r0,r3,r5 +2``: the first ``named`` ranks, then how many more."""
    shown = ",".join(f"r{r}" for r in ranks[:named])
    return shown + (f" +{len(ranks) - named}" if len(ranks) > named else "")


def lost_alert(state: ClusterState, lost: list[int]) -> Alert:
    """The alert naming ranks that will never say Bye (killed or crashed without a word), with
    the earliest of their last reported steps: the live view's and the finished run's."""
    last = min((rs.latest.step for r in lost if (rs := state.ranks[r]).latest), default=0)
    return Alert(
        kind="lost",
        severity="critical",
        ranks=tuple(lost),
        message=f"{ranks_text(lost)} died without a word after step {last} (no Bye)",
    )


def evaluate(state: ClusterState, now_s: float) -> list[Alert]:
    rules = state.rules
    alerts: list[Alert] = []

    # The per-rank conditions (low memory, silent, failed, ended, dropping) are kept by
    # ClusterState as messages arrive (state/conditions.py): a 16,384-rank view evaluates the
    # alerts every frame, and even one pass over the ranks cost 9-15 ms of it.
    book = state.conditions
    if not book.memory_rules(rules.headroom_min, rules.host_available_min):
        hosts = {r: rs.host for r, rs in state.ranks.items() if rs.host is not None}
        book.rejudge_memory(hosts, rules.headroom_min, rules.host_available_min)
    low = sorted(book.low)
    silent = book.silent(now_s, rules.silent_s)
    failed = sorted(book.failed)
    dropping = sorted(book.dropping)
    ended = bool(book.byes)
    oom = sorted({e.rank for e in state.events if e.event == "oom_warning"})
    if low or oom:
        ranks = sorted(set(low) | set(oom))
        alerts.append(
            Alert(
                kind="memory",
                severity="critical",
                ranks=tuple(ranks),
                message=f"memory headroom low on {ranks_text(ranks)}",
            )
        )

    latest = state.latest()
    min_scale = state.config.min_loss_scale if state.config else 1.0
    at_min = [e.step for e in state.events if e.event == "scale_at_minimum"]
    if at_min or (latest and latest.loss_scale is not None and latest.loss_scale <= min_scale):
        alerts.append(
            Alert(
                kind="loss_scale_min",
                severity="critical",
                first_step=min(at_min) if at_min else (latest.step if latest else None),
                message=f"loss scale at its minimum ({min_scale:g})",
            )
        )

    window = state.complete_steps()[-rules.storm_window :]
    overflows = sum(1 for a in window if a.overflow)
    if overflows >= rules.storm_overflows:
        alerts.append(
            Alert(
                kind="overflow_storm",
                severity="warning",
                first_step=next(a.step for a in window if a.overflow),
                message=f"overflow storm: {overflows} of the last {len(window)} steps skipped",
            )
        )

    alerts += _lag_alerts(state)

    recent = state.complete_steps()[-rules.straggler_window :]
    shares = [a.exposed_share for a in recent if a.exposed_share is not None]
    if shares and sum(shares) / len(shares) > rules.exposed_max:
        share = sum(shares) / len(shares)
        alerts.append(
            Alert(
                kind="exposed_comm",
                severity="warning",
                first_step=recent[0].step,
                message=f"exposed comm {share:.0%} of the step on every rank "
                f"(the least-exposed rank's wait, last {len(shares)} steps)",
            )
        )

    if silent:
        last = min((rs.latest.step for r in silent if (rs := state.ranks[r]).latest), default=0)
        alerts.append(
            Alert(
                kind="silent",
                severity="critical",
                ranks=tuple(silent),
                message=f"no word for >{rules.silent_s:g}s from {ranks_text(silent)}"
                f" (after step {last})",
            )
        )

    if failed:
        alerts.append(
            Alert(
                kind="exited",
                severity="critical",
                ranks=tuple(failed),
                message=f"rank exited with an error: {ranks_text(failed)}",
            )
        )

    # The job is ending (some rank said Bye) and a rank never will: killed or crashed with no
    # word (SIGKILL, the OOM killer). When a peer failed, it is the likely first failure:
    # every rank without a Bye; else the silent ones.
    lost: list[int] = []
    if ended:
        lost = sorted(state.ranks.keys() - book.byes) if failed else silent
    if lost:
        alerts.append(lost_alert(state, lost))

    missing = state.missing()
    since = state.roster.since_s
    if missing and since is not None and now_s - since > rules.missing_after_s:
        reported, world = headcount(state)
        alerts.append(
            Alert(
                kind="missing",
                severity="critical",
                ranks=tuple(r for g in missing for r in g.ranks),
                message=missing_summary(missing, reported, world),
            )
        )

    # A node relay the collector cannot hear: its node's ranks named at once, with the reason.
    for outage in relay_outages_of(state):
        alerts.append(
            Alert(kind="relay", severity="critical", ranks=outage.ranks, message=outage.text)
        )

    if state.recording_error:
        alerts.append(Alert(kind="recording", severity="critical", message=state.recording_error))

    if dropping:
        total = sum(state.ranks[r].dropped for r in dropping)
        alerts.append(
            Alert(
                kind="drops",
                severity="warning",
                ranks=tuple(dropping),
                message=f"agent dropped {total} messages on {ranks_text(dropping)}",
            )
        )
    return alerts


def _lag_alerts(state: ClusterState) -> list[Alert]:
    """One alert for slow-compute ranks (``straggler``), one for slow-link ranks."""
    out = []
    findings = state.findings()
    for kind, what in (
        ("straggler", "+{ms} compute per step vs the others{ratio}"),
        ("slow_link", "+{ms} per step in its own collectives vs the others'"),
    ):
        found = [f for f in findings if f.kind == kind]
        if not found:
            continue
        parts = []
        for f in found[:3]:
            ratio = f" ({f.slowness:.2f}x)" if f.slowness and kind == "straggler" else ""
            text = what.format(ms=f"{f.excess_s * 1e3:.0f} ms", ratio=ratio)
            parts.append(f"r{f.rank} {text} since step {f.first_step}")
        more = f"; +{len(found) - 3} more" if len(found) > 3 else ""
        out.append(
            Alert(
                kind=kind,
                severity="warning",
                ranks=tuple(f.rank for f in found),
                first_step=min(f.first_step for f in found),
                message=("straggler " if kind == "straggler" else "slow link ")
                + "; ".join(parts)
                + more,
            )
        )
    return out
