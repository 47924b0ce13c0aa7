"""One rank's step as every view needs it (:class:`StepSummary`, with its per-op
:class:`OpTotals`): made by zeroscope.state.rank ``summarize``, the one definition, and part of
the wire, re-exported by :mod:`zeroscope.agent.schema`.

Why on the wire: at 16,384 ranks the viewer's cost is per report, and most of a report's fold
is its summary (~20 us of a ~32 us ingest: the pass over its collectives). A node's relay has
each report decoded already (zeroscope/collector/relay_batch.py); it makes the summary there,
on one of the node's many cores, and sends it inside the report (``StepReport.summary``), so the
viewer, the trace and a replay's seek take it as made. A report without one (sent directly to
the collector, or from a trace written before) is folded by the viewer as before. The struct
here is what the state keeps, so a decoded summary is the very object the state holds: no copy.

Both are msgspec Structs with ``gc=False``: one of each is made for every report of every rank,
and a rank's history keeps 512 steps of them (8 M summaries at 16,384 ranks). Untracked by the
cyclic garbage collector, they are never walked by it (nor is the ``ops`` dict of untracked
OpTotals, which CPython leaves untracked); safe because neither can be part of a reference
cycle: a summary holds numbers, its ``ops`` dict of OpTotals and the report's ``Work``. Measured
at 16,384 ranks (bench/view_ingest.py, Python's default collector thresholds): the collections
in four steps' ingest fell from ~560 to ~115 ms (docs/bench.md). ``array_like``: a summary on
the wire is its values in field order (~35), without the names.

Compatibility: ``version`` comes first; a change of the fields' meaning bumps
:data:`SUMMARY_VERSION`, and a change of their types or order also renames
``StepReport.summary``, so an older viewer (which ignores unknown fields) never fails to decode
a report for its summary. Stands alone like the schema: msgspec and nothing of the project.
"""

from __future__ import annotations

import msgspec

from .schema_work import Work

SUMMARY_VERSION = 1
"""Of the summary's fields and their definitions (zeroscope.state.rank ``summarize``)."""


def busbw_of(bus_bytes: float, seconds: float) -> float | None:
    """Time-weighted busbw of many collectives: sum(S * factor) / sum(t), bytes/s; NA for no
    time. The one definition: zeroscope.state.bandwidth re-exports it for the run's figures."""
    return bus_bytes / seconds if seconds > 0 else None


class OpTotals(msgspec.Struct, array_like=True, gc=False):
    """One collective op's totals within a step (the rank-detail table's row). Untracked by the
    garbage collector (``gc=False``: numbers only; the module's docstring says why)."""

    count: int = 0
    nbytes: int = 0
    """Sum of message sizes S (nccl-tests convention) [bytes]."""
    volume: int = 0
    """Sum of :func:`bandwidth.volume` (all-reduce counts 2S) [bytes]."""
    seconds: float = 0.0
    """Sum of issue-to-completion times [s]."""
    exposed_s: float = 0.0
    """Sum of the time the loop waited for them [s]."""
    bus_bytes: float = 0.0
    """Sum of S x the nccl-tests bus factor of each collective's own group size [bytes], over
    the collectives with a time (clock not ``none``, and more than 0 s: a synchronous op handed
    to the agent after it ran has 0 s; bytes with no time would inflate the bandwidth)."""
    untimed: int = 0
    """Collectives no clock measured (``Collective.clock`` none): in count, bytes and volume,
    never in seconds, busbw or exposed."""
    unexposed: int = 0
    """Collectives whose exposed time was not measured."""

    @property
    def busbw(self) -> float | None:
        """Time-weighted bus bandwidth: sum(S·factor) / sum(t) [bytes/s]; NA when any of the
        op's collectives was untimed (a part would pass for the whole: a 4-byte host-timed
        all-reduce beside DDP's untimed buckets on gloo read 0.000 GB/s), and for an op that
        moved no bytes (a barrier: its time is waiting, not a link's rate)."""
        if self.untimed or not self.nbytes:
            return None
        return busbw_of(self.bus_bytes, self.seconds)

    @property
    def time_s(self) -> float | None:
        """Summed issue-to-completion time [s]; NA when any collective of the op was untimed
        (a partial sum would pass for the whole)."""
        return None if self.untimed else self.seconds

    @property
    def exposed(self) -> float | None:
        """Summed exposed time [s]; NA when any collective of the op had it unmeasured (a
        partial sum would pass for the whole)."""
        return None if self.unexposed else self.exposed_s


class StepSummary(msgspec.Struct, array_like=True, gc=False):
    """One rank's step, as every view needs it. None = not reported (NA), never 0. Untracked by
    the garbage collector (``gc=False``: no cycle can run through it; the module's docstring
    says why); copy one with ``msgspec.structs.replace``."""

    version: int
    """:data:`SUMMARY_VERSION` of the code that made it: first, so a viewer reads it before
    any field whose meaning a later version changed, and folds the report itself when it is
    not its own."""
    step: int
    wall_ns: int
    duration_s: float
    """The rank's step time [s]."""
    params: int | None
    grads: int | None
    optim: int | None
    activations: int | None
    host_bytes: int
    """Offloaded P + G + O in host memory [bytes]."""
    gathered_params: int
    nvme_bytes: int
    device_peak: int | None
    comm_volume: int
    """Sum of every collective's volume (all-reduce counts twice; bandwidth.volume) [bytes]."""
    comm_s: float
    """Sum of collective issue-to-completion times [s]."""
    busy_s: float
    """Time with a collective in flight (zeroscope.state.collective_fold.busy_seconds) [s]."""
    exposed_s: float
    """Time the loop waited inside collectives: sum of ``Collective.exposed_s`` [s]."""
    bus_bytes: float
    offload_bytes: int
    offload_s: float
    loss: float | None
    loss_scale: float | None
    grad_norm: float | None
    lr: float | None
    overflow: bool
    samples: int
    prefetched: int
    """Collectives issued ahead of need (stage-3 prefetch)."""
    collectives: int
    """Collectives reported in the step."""
    ops: dict[str, OpTotals]
    untimed: int = 0
    """Collectives no clock measured: counted in ``collectives`` and ``comm_volume`` only."""
    unexposed: int = 0
    """Collectives whose exposed time was not measured: ``exposed_share`` is then NA."""
    sequence: int = 0
    """Fingerprint of the step's collective sequence (op, bytes, label, in issue order), equal
    across processes (a relay makes it, the viewer compares ranks: zeroscope.state.sequences);
    0 = not comparable (some collectives unfinished) or none issued."""
    frozen_params: int | None = None
    """Of ``params``: bytes of frozen parameters (no G or O of their own); None = not said."""
    work: Work | None = None
    """Tokens, model FLOPs and the device's peak as the rank sent them (None = not reported);
    the figures made of them are zeroscope.state.throughput's."""
    forward_backward_s: float | None = None
    """The step's forward plus backward phase time [s] (None = neither reported): the compute
    a stage-3 prefetch can hide its fetches behind, priced per step by the advisor."""
    eval_s: float | None = None
    """The evaluation run before this step, within its time (``Phases.eval``) [s]; None = none."""

    @property
    def train_s(self) -> float:
        """The step's time less the evaluation in it [s]: what its counted work (training
        forwards and backwards only) is a rate over (zeroscope/state/throughput.py)."""
        return self.duration_s - (self.eval_s or 0.0)

    @property
    def compute_s(self) -> float | None:
        """Compute time: the step minus the time waiting in collectives [s]. Under synchronous
        collectives every rank's step time is the same; this is what differs. NA when some
        collective's wait was not measured (DDP's buckets on gloo): the step less a partial
        wait is the step time again, which names no straggler and would pass for compute."""
        if self.unexposed:
            return None
        return max(self.duration_s - self.exposed_s, 0.0)

    @property
    def exposed(self) -> float | None:
        """The loop's wait in collectives [s]; NA when some collective's wait was not measured
        (a partial sum would pass for the whole)."""
        return None if self.unexposed else self.exposed_s

    @property
    def exposed_share(self) -> float | None:
        """Exposed %: the share of the step the loop waited inside collectives
        (exposed_s / duration_s) [fraction]; NA for a zero-length step or when some
        collective's wait was not measured."""
        if self.unexposed or self.duration_s <= 0:
            return None
        return self.exposed_s / self.duration_s

    @property
    def busbw(self) -> float | None:
        """Time-weighted busbw of all the step's collectives [bytes/s]; NA when some were
        untimed (as :attr:`OpTotals.busbw`)."""
        return None if self.untimed else busbw_of(self.bus_bytes, self.comm_s)

    @property
    def offload_bw(self) -> float | None:
        """Offload transfer bytes / transfer time [bytes/s]."""
        return self.offload_bytes / self.offload_s if self.offload_s > 0 else None

    @property
    def model_states(self) -> int | None:
        """P + G + O on the device [bytes]; NA when none of them was reported."""
        p, g, o = self.params, self.grads, self.optim
        if p is None and g is None and o is None:
            return None
        return (p or 0) + (g or 0) + (o or 0)

    @property
    def device_total(self) -> int | None:
        """P + G + O + A [bytes] (the parts reported); NA when none was. (Read for every rank
        of every closed step: written out, no lists.)"""
        p, g, o, a = self.params, self.grads, self.optim, self.activations
        if p is None and g is None and o is None and a is None:
            return None
        return (p or 0) + (g or 0) + (o or 0) + (a or 0)
