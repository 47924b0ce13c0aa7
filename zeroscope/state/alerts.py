"""Alerts: the few conditions a person watching a ZeRO job must not miss, computed from
ClusterState. One Alert per condition (listing the ranks it hits), so the strip stays readable
at 1024 ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .cluster import ClusterState

Severity = Literal["warning", "critical"]


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
    straggler_k: float = 3.0
    straggler_min: float = 0.05
    """A straggler is also at least this much slower than the median (MAD can be ~0)."""
    straggler_steps: int = 3
    exposed_max: float = 0.30
    silent_s: float = 2.0

    def __post_init__(self) -> None:
        if self.storm_overflows < 1 or self.storm_window < self.storm_overflows:
            raise ValueError("storm_overflows must be >= 1 and <= storm_window")
        if self.straggler_steps < 1:
            raise ValueError("straggler_steps must be >= 1")


@dataclass(frozen=True, slots=True)
class Alert:
    kind: str
    severity: Severity
    message: str
    ranks: tuple[int, ...] = ()


def interrupted(bye_message: str) -> bool:
    """A rank that ended on KeyboardInterrupt was stopped (Ctrl-C), not failing."""
    return bye_message.startswith("KeyboardInterrupt")


def _ranks_text(ranks: list[int]) -> str:
    shown = ",".join(f"r{r}" for r in ranks[:6])
    return shown + (f" +{len(ranks) - 6}" if len(ranks) > 6 else "")


def evaluate(state: ClusterState, now_s: float) -> list[Alert]:
    rules = state.rules
    alerts: list[Alert] = []

    low: list[int] = []
    for r, rs in sorted(state.ranks.items()):
        host = rs.latest.host if rs.latest else None
        if host is None:
            continue
        total, used = host.gpu_mem_total_bytes, host.gpu_mem_used_bytes
        if (total and used is not None and (total - used) / total < rules.headroom_min) or (
            host.mem_available_bytes is not None
            and (host.mem_available_bytes < rules.host_available_min)
        ):
            low.append(r)
    oom = sorted({e.rank for e in state.events if e.event == "oom_warning"})
    if low or oom:
        ranks = sorted(set(low) | set(oom))
        alerts.append(
            Alert(
                kind="memory",
                severity="critical",
                ranks=tuple(ranks),
                message=f"memory headroom low on {_ranks_text(ranks)}",
            )
        )

    latest = state.latest()
    min_scale = state.config.min_loss_scale if state.config else 1.0
    at_min = any(e.event == "scale_at_minimum" for e in state.events)
    if at_min or (latest and latest.loss_scale is not None and latest.loss_scale <= min_scale):
        alerts.append(
            Alert(
                kind="loss_scale_min",
                severity="critical",
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
                message=f"overflow storm: {overflows} of the last {len(window)} steps skipped",
            )
        )

    slow = sorted(
        r for r, rs in state.ranks.items() if rs.straggling_steps >= rules.straggler_steps
    )
    if slow:
        worst = max(slow, key=lambda r: state.slowness(r) or 0.0)
        factor = state.slowness(worst)
        extra = f" (r{worst} {factor:.2f}x median)" if factor else ""
        alerts.append(
            Alert(
                kind="straggler",
                severity="warning",
                ranks=tuple(slow),
                message=f"straggler {_ranks_text(slow)}{extra}",
            )
        )

    exposed = sorted(
        r
        for r, rs in state.ranks.items()
        if rs.summary and (rs.summary.exposed_share or 0.0) > rules.exposed_max
    )
    if exposed:
        worst_share = max(state.ranks[r].summary.exposed_share or 0.0 for r in exposed)  # type: ignore[union-attr]
        alerts.append(
            Alert(
                kind="exposed_comm",
                severity="warning",
                ranks=tuple(exposed),
                message=f"exposed comm {worst_share:.0%} of step on {_ranks_text(exposed)}",
            )
        )

    silent = sorted(
        r
        for r, rs in state.ranks.items()
        if rs.bye is None and rs.last_seen_s is not None and now_s - rs.last_seen_s > rules.silent_s
    )
    if silent:
        last = min((rs.latest.step for r in silent if (rs := state.ranks[r]).latest), default=0)
        alerts.append(
            Alert(
                kind="silent",
                severity="critical",
                ranks=tuple(silent),
                message=f"no word for >{rules.silent_s:g}s from {_ranks_text(silent)}"
                f" (after step {last})",
            )
        )

    failed = sorted(
        r
        for r, rs in state.ranks.items()
        if rs.bye and rs.bye.exit_code != 0 and not interrupted(rs.bye.message)
    )
    if failed:
        alerts.append(
            Alert(
                kind="exited",
                severity="critical",
                ranks=tuple(failed),
                message=f"rank exited with an error: {_ranks_text(failed)}",
            )
        )

    # The job is ending (some rank said Bye) and a rank never will: killed or crashed with no
    # word (SIGKILL, the OOM killer). When a peer failed, it is the likely first failure.
    ended = any(rs.bye for rs in state.ranks.values())
    lost = sorted(
        r
        for r, rs in state.ranks.items()
        if ended
        and rs.bye is None
        and (failed or (rs.last_seen_s is not None and now_s - rs.last_seen_s > rules.silent_s))
    )
    if lost:
        last = min((rs.latest.step for r in lost if (rs := state.ranks[r]).latest), default=0)
        alerts.append(
            Alert(
                kind="lost",
                severity="critical",
                ranks=tuple(lost),
                message=f"{_ranks_text(lost)} died without a word after step {last} (no Bye)",
            )
        )

    if state.recording_error:
        alerts.append(Alert(kind="recording", severity="critical", message=state.recording_error))

    dropping = sorted(r for r, rs in state.ranks.items() if rs.dropped)
    if dropping:
        total = sum(state.ranks[r].dropped for r in dropping)
        alerts.append(
            Alert(
                kind="drops",
                severity="warning",
                ranks=tuple(dropping),
                message=f"agent dropped {total} messages on {_ranks_text(dropping)}",
            )
        )
    return alerts
