"""The run's figures as one plain dict: what ``zeroscope summary --json`` prints and ``export``
embeds, read off ClusterState after the whole trace went through it — so the summary, the
export, ``replay --headless`` and the live view's final lines are the same numbers.

Units are in the key names: ``*_s`` seconds, ``*_bytes*`` bytes, ``*_per_s`` per second,
``*_percent`` percent, ``mfu`` a fraction of the peak. None is NA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .alerts import Alert, lost_alert
from .bandwidth import busbw_of, collective_busbw, duration_of, exposed_of, volume
from .ending import end_alerts
from .throughput import Throughput, cluster_run, rank_run

if TYPE_CHECKING:
    from zeroscope.agent.schema import Collective

    from .alerts import AlertRules
    from .cluster import ClusterState
    from .rank import RankState

TOTAL_AGGREGATION = {
    "steps": "cluster: complete steps",
    "mean_step_s": "cluster: the steady steps' period (span of step ends / steps) = 1 / steps_per_s",
    "params_peak": "max over ranks",
    "frozen_params_peak": "max over ranks",
    "grads_peak": "max over ranks",
    "optim_peak": "max over ranks",
    "activations_peak": "max over ranks",
    "comm_bytes_per_step": "sum over ranks",
    "exposed_percent": "cluster: the least-exposed rank's wait / step time, steady steps",
    "busbw_bytes_s": "time-weighted over every rank's collectives; NA when some had no clock",
    "offload_bytes_s": "over every rank's transfers (bytes / time)",
    "overflows": "cluster: steps with an overflow on any rank",
    "tokens_per_s": "cluster: every rank's tokens / the step time (its slowest rank's), steady steps",
    "tflops_per_s": "cluster: every rank's counted model FLOPs / the step time, steady steps",
    "mfu": "cluster: the ranks' FLOPs / (step time x the sum of their peaks) [fraction]",
    "mfu_percent": "the same, in percent",
}
"""How the ``all`` row of the summary combines the ranks, column by column."""


def collective_figures(c: Collective) -> dict[str, Any]:
    """One collective's figures as ``export`` shows them on its slice: the paper's volume
    (bytes), its duration and exposed time (s) and busbw (bytes/s, nccl-tests convention):
    each None (NA) when not measurable or when no clock measured it (``Collective.clock``)."""
    return {
        "volume_bytes": volume(c.op, c.nbytes),
        "duration_s": duration_of(c),
        "exposed_s": exposed_of(c),
        "busbw_bytes_s": collective_busbw(c),
    }


def _percent(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def rank_row(rs: RankState, rules: AlertRules) -> dict[str, Any]:
    """One rank's run figures (RankTotals), the summary table's row, with the exposed share's
    level (``AlertRules.exposed_level``: the screens' colour, for summary and export)."""
    t = rs.totals
    return {
        "rank": rs.rank,
        "steps": t.steps,
        "mean_step_s": t.mean_step_s,
        "params_peak": t.params_peak,
        "frozen_params_peak": t.frozen_params_peak,
        "grads_peak": t.grads_peak,
        "optim_peak": t.optim_peak,
        "activations_peak": t.activations_peak,
        "host_peak": t.host_peak,
        "device_peak": t.device_peak,
        "comm_bytes_per_step": t.comm_bytes_per_step,
        "exposed_percent": _percent(t.exposed_share),
        "exposed_level": rules.exposed_level(t.exposed_share),
        "busbw_bytes_s": t.busbw,
        "offload_bytes_s": t.offload_bw,
        "overflows": t.overflows,
    }


def _peak(rows: list[dict[str, Any]], key: str) -> int | None:
    values = [r[key] for r in rows if r[key] is not None]
    return max(values) if values else None


def total_row(state: ClusterState, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``all`` row, combined as TOTAL_AGGREGATION says."""
    ranks = [state.ranks[r] for r in sorted(state.ranks)]  # a fixed order: identical sums
    sums = [s for rs in ranks if (s := rs.totals.sums()) is not None]
    per_step = [r["comm_bytes_per_step"] for r in rows if r["comm_bytes_per_step"] is not None]
    offload_s = sum(s.offload_s for s in sums)
    return {
        "rank": None,
        "steps": state.totals.steps,
        "mean_step_s": state.totals.mean_step_s,
        **{
            k: _peak(rows, k)
            for k in ("params_peak", "frozen_params_peak", "grads_peak", "optim_peak")
        },
        "activations_peak": _peak(rows, "activations_peak"),
        "host_peak": _peak(rows, "host_peak"),
        "device_peak": _peak(rows, "device_peak"),
        "comm_bytes_per_step": sum(per_step) if per_step else None,
        "exposed_percent": _percent(state.totals.exposed_share),
        "exposed_level": state.rules.exposed_level(state.totals.exposed_share),
        "busbw_bytes_s": None
        if any(s.untimed for s in sums)
        else busbw_of(sum(s.bus_bytes for s in sums), sum(s.comm_s for s in sums)),
        "offload_bytes_s": sum(s.offload_bytes for s in sums) / offload_s if offload_s else None,
        "overflows": state.totals.overflows,
    }


def missing_rows(state: ClusterState) -> list[dict[str, Any]]:
    """Every rank of the job that never reported, with the reason (zeroscope.state.roster):
    ``{"rank", "node", "reason", "message"}``, in rank order."""
    from .roster import missing_of

    rows = [
        {"rank": r, "node": g.node, "reason": g.reason, "message": g.explanation}
        for g in missing_of(state)
        for r in g.ranks
    ]
    return sorted(rows, key=lambda row: row["rank"])


def throughput_fields(t: Throughput) -> dict[str, Any]:
    """Tokens/s, TFLOP/s and MFU with what they rest on (zeroscope.state.throughput); None is
    NA and ``throughput_na`` says why; ``throughput_over`` names a figure over a run that rests
    on some of its steps, and why the rest are out."""
    return {
        "tokens_per_s": t.tokens_per_s,
        "tflops_per_s": t.tflops_per_s,
        "mfu": t.mfu,
        "mfu_percent": t.mfu_percent,
        "peak_tflops": t.peak_tflops,
        "peak_source": t.peak_source,
        "tokens_per_step": t.tokens_per_step,
        "flops_per_step": t.flops_per_step,
        "predicted_flops_per_step": t.predicted_flops_per_step,
        "throughput_na": t.na,
        "throughput_over": t.over,
    }


def _lost(state: ClusterState) -> list[Alert]:
    """After the run, the ranks with no Bye when others said theirs: killed or crashed without
    a word (the live view's ``lost`` alert waits for their silence; a finished run's silence is
    its end, so it is left out above and said here as exit_lines says it)."""
    if state.job_end is not None and state.job_end.stopped:
        return []  # a stop on request: the Byes need not have come
    ranks = state.ranks
    if not any(rs.bye for rs in ranks.values()):
        return []
    lost = sorted(r for r, rs in ranks.items() if rs.bye is None)
    return [lost_alert(state, lost)] if lost else []


def _clock_coverage(state: ClusterState) -> dict[str, int]:
    """How many of the steady steps' collectives (every rank's) no clock measured: busbw is NA
    where there were any, and the summary says why."""
    sums = [s for rs in state.ranks.values() if (s := rs.totals.sums()) is not None]
    return {
        "collectives": sum(s.collectives for s in sums),
        "untimed_collectives": sum(s.untimed for s in sums),
    }


def run_report(state: ClusterState) -> dict[str, Any]:
    """Cluster figures, alerts and the per-rank table of a run (after ``state.flush()``).
    Alerts about silence or lost ranks are left out: after a run, silence is its end."""
    rows = [rank_row(state.ranks[r], state.rules) for r in sorted(state.ranks)]
    t = state.totals
    for row in rows:
        row.update(throughput_fields(rank_run(state.ranks[row["rank"]], t.first_step)))
    run = throughput_fields(cluster_run(state))
    total = total_row(state, rows)
    total.update(run)
    return {
        "job_id": state.job_id,
        "world_size": state.world_size or len(state.ranks),
        "steps": t.steps,
        "steps_per_s": t.steps_per_s,
        "samples_per_s": t.samples_per_s,
        "samples_na": t.samples_na,
        "mean_step_s": t.mean_step_s,
        "exposed_percent": _percent(t.exposed_share),
        "grad_norm_final": t.grad_norm_final,
        "grad_norm_max": t.grad_norm_max,
        "grad_norm_max_step": t.grad_norm_max_step,
        **run,
        "exposed_level": state.rules.exposed_level(t.exposed_share),
        **_clock_coverage(state),
        "job_end": None if state.job_end is None else state.job_end.sentences(),
        "job_stopped": None if state.job_end is None else state.job_end.stopped,
        "alerts": [
            *(a.as_dict() for a in end_alerts(state.job_end)),
            *(a.as_dict() for a in state.alerts() if a.kind not in ("silent", "lost")),
            *(a.as_dict() for a in _lost(state)),
        ],
        "missing_ranks": missing_rows(state),
        "ranks": rows,
        "total": total,
        "total_aggregation": TOTAL_AGGREGATION,
        "thinned": state.thinned or None,
    }
