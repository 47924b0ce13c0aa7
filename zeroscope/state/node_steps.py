"""A node's ranks in one step, folded: the one definition of the per-node aggregate.

Two places fold it: a node's relay (collector/relay_batch.py), once per report on the node,
sending the result in its batch header (:class:`zeroscope.agent.schema.NodeStep`); and the
trace's thinning (store/thinning.py), for reports that came without a relay. Both call
:func:`add_report`; partial aggregates of one (step, node) (two batches of one step, a late
rank) combine with :func:`merge`, whose result does not depend on the order the reports came
in: counts and sums add, extremes take the extreme, and a tie for the slowest step goes to the
lower rank. The trace's ``node_steps`` row is :func:`row`.
"""

from __future__ import annotations

from zeroscope.agent.schema import BatchEntry, NodeStep, StepReport


def figures(report: StepReport) -> tuple[float, int, int]:
    """(exposed seconds, P+G+O+A bytes, collective bytes) of one report: the exposed wait of
    every collective (one not measured counts 0), the parts of memory reported (one not
    reported counts 0), every collective's ``nbytes``."""
    exposed = 0.0
    comm = 0
    for c in report.collectives:
        comm += c.nbytes
        exposed += c.exposed_s or 0.0
    m = report.memory
    held = (m.params or 0) + (m.grads or 0) + (m.optim or 0) + (m.activations or 0)
    return exposed, held, comm


def add_report(
    agg: NodeStep | None,
    node_rank: int,
    report: StepReport,
    its_figures: tuple[float, int, int] | None = None,
) -> NodeStep:
    """``agg`` with ``report`` folded in (a new aggregate when ``agg`` is None);
    ``its_figures``: :func:`figures` of the report, when the caller has them."""
    exposed, held, comm = its_figures or figures(report)
    one = NodeStep(
        step=report.step,
        node_rank=node_rank,
        ranks=1,
        step_s_min=report.duration_s,
        step_s_sum=report.duration_s,
        step_s_max=report.duration_s,
        slowest_rank=report.rank,
        wall_ns_max=report.wall_ns,
        memory_max=held,
        memory_min=held,
        exposed_s_max=exposed,
        comm_bytes=comm,
        samples=report.samples,
        alerted=report.overflow or report.skipped,
    )
    if agg is None:
        return one
    merge(agg, one)
    return agg


def merge(into: NodeStep, other: NodeStep) -> None:
    """Fold ``other`` (the same step and node) into ``into``."""
    into.ranks += other.ranks
    into.step_s_min = min(into.step_s_min, other.step_s_min)
    into.step_s_sum += other.step_s_sum
    if other.step_s_max > into.step_s_max or (
        other.step_s_max == into.step_s_max and other.slowest_rank < into.slowest_rank
    ):
        into.step_s_max, into.slowest_rank = other.step_s_max, other.slowest_rank
    into.wall_ns_max = max(into.wall_ns_max, other.wall_ns_max)
    into.memory_max = max(into.memory_max, other.memory_max)
    into.memory_min = min(into.memory_min, other.memory_min)
    into.exposed_s_max = max(into.exposed_s_max, other.exposed_s_max)
    into.comm_bytes += other.comm_bytes
    into.samples += other.samples
    into.alerted = into.alerted or other.alerted


def entry(report: StepReport, size: int, node_rank: int, exposed: float) -> BatchEntry:
    """The batch header's line for one report of ``size`` msgpack bytes (``exposed``: its
    :func:`figures`' first)."""
    return BatchEntry(
        rank=report.rank,
        step=report.step,
        wall_ns=report.wall_ns,
        size=size,
        dropped=report.dropped,
        node_rank=node_rank,
        duration_s=report.duration_s,
        exposed_s=exposed,
        alerted=report.overflow or report.skipped,
    )


_SQLITE_INT = range(-(2**63), 2**63)
"""What SQLite's INTEGER holds. Steps, ranks and instants are checked on decode
(agent/schema.py); the node's sums are not bounded by any one field."""


def _stored(v: int) -> float:
    """A sum as the trace's row keeps it: itself, or past SQLite's 64-bit integers (only a
    faulty sender's figures: 8 EiB) a REAL of its size, rather than a failed commit that would
    stop the recording."""
    return v if v in _SQLITE_INT else float(v)


def row(agg: NodeStep) -> tuple[float, ...]:
    """The trace's ``node_steps`` row (store/thinning.py's columns)."""
    return (
        agg.step,
        agg.node_rank,
        agg.ranks,
        agg.step_s_min,
        agg.step_s_sum / agg.ranks,
        agg.step_s_max,
        agg.slowest_rank,
        agg.wall_ns_max,
        _stored(agg.memory_max),
        agg.exposed_s_max,
        _stored(agg.comm_bytes),
        _stored(agg.samples),
    )
