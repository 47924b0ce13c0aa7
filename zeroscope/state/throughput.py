"""Throughput as training users read it: tokens per second, achieved model TFLOP/s and MFU,
per rank and for the cluster, per step and over the run; and the closed-form prediction of a
step's FLOPs beside the counted figure.

Definitions (one place; every view formats these):

- tokens/s = tokens of the step / step time. A rank's: its own tokens / its step time; the
  cluster's: every rank's tokens added up / the cluster's step time (its slowest rank's).
  Step time here is the training time: an evaluation run inside a step (``StepSummary.eval_s``)
  is left out, as its forwards are out of the tokens and FLOPs counted.
- TFLOP/s = model FLOPs of the step (forward + backward, counted by the agent with torch's
  FLOP formulas: agent/flops.py) / step time / 10^12. Model FLOPs, not hardware FLOPs:
  activation recomputation is counted only if it ran on the counted step.
- MFU = achieved FLOP/s / the device's peak FLOP/s (PaLM, Chowdhery et al. 2022, appendix B).
  The cluster's: the ranks' FLOPs / (step time x the sum of their peaks). The peak is the
  datasheet's dense figure for a known GPU, else a measured matmul's (``peak_source`` says).
- predicted FLOPs = 6·N·T + 12·layers·hidden·seq·T, T the positions computed (batch x seq,
  padding included), N the parameters doing matmul work (embedding tables left out), the
  second term the attention scores and their use (forward 4·seq·hidden per position and layer,
  backward twice that; PaLM appendix B). Tokens/s leaves padding out where a mask said so.

A figure nobody measured is None with the reason (``na``): a rank that did not say its tokens
(non-sequence inputs), FLOPs not counted for its shapes, no peak known.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from typing import TYPE_CHECKING, cast

import msgspec

if TYPE_CHECKING:
    from zeroscope.agent.schema import Work

    from .cluster import ClusterState, StepAggregate
    from .rank import RankState, StepSummary


@dataclass(frozen=True, slots=True)
class Throughput:
    """Tokens/s, TFLOP/s and MFU of one rank or the cluster over one step or a run. None is
    NA; ``na`` says why (empty when every figure is known)."""

    tokens_per_s: float | None = None
    tflops_per_s: float | None = None
    mfu: float | None = None
    """[fraction] of the peak."""
    peak_tflops: float | None = None
    peak_source: str = ""
    flops_per_step: float | None = None
    """Counted model FLOPs of one step (the rank's, or every rank's added up)."""
    predicted_flops_per_step: float | None = None
    """The closed form's (:func:`predicted_flops`)."""
    tokens_per_step: int | None = None
    na: str = ""
    over: str = ""
    """Figures over several steps: which rest on only some of them, and why the rest are out
    (empty when each rests on every step, or is NA)."""

    @property
    def mfu_percent(self) -> float | None:
        return None if self.mfu is None else 100.0 * self.mfu


NOT_REPORTED = "the rank reported no tokens or FLOPs (no model forward seen)"


_PREDICTED_TERMS = attrgetter("dense_params", "positions", "layers", "hidden", "seq_len")


def predicted_flops(work: Work) -> float | None:
    """6·N·T + 12·layers·hidden·seq·T [FLOPs], T the positions the model computed on (padding
    included: the model computes it); None when a term is unknown."""
    return _predicted(*_PREDICTED_TERMS(work))


def _predicted(
    n: int | None, tokens: int | None, layers: int | None, hidden: int | None, seq: int | None
) -> float | None:
    """:func:`predicted_flops` of its terms (N, T, layers, hidden, seq)."""
    if n is None or tokens is None or not (layers and hidden and seq):
        return None
    return 6.0 * n * tokens + 12.0 * layers * hidden * seq * tokens


def _mfu(flops_per_s: float | None, peak: float | None, na: str) -> tuple[float | None, str]:
    """MFU and why it is NA. Above 1 the peak was no ceiling (a matmul probe slowed by other
    load, or run in a dtype slower than the model's kernels: the demo's fp16 on a CPU read
    263 %), and a figure over 100 % would only mislead: NA, with both numbers."""
    if flops_per_s is None or not peak:
        return None, na
    mfu = flops_per_s / peak
    if mfu > 1.0:
        return None, na or (
            f"MFU NA: the model reached {flops_per_s / 1e12:.3g} TFLOP/s, above the peak "
            f"{peak / 1e12:.3g} TFLOP/s it was to be measured against (no ceiling)"
        )
    return mfu, na


def _reason(work: Work | None) -> str:
    """Why a rank's figures are NA: each reason that holds, joined by "; " (tokens or FLOPs
    not measured, and the peak MFU needs not known yet)."""
    if work is None:
        return NOT_REPORTED
    reasons = []
    if work.tokens is None or work.flops is None:
        reasons.append(work.na or "not measured")
    if work.peak_flops is None and work.flops is not None:
        reasons.append(f"MFU: {work.peak_source or 'no peak known'}")
    return "; ".join(reasons)


def reasons_of(na: str) -> list[str]:
    """The distinct reasons a joined ``na`` holds, in order."""
    return list(dict.fromkeys(r for r in na.split("; ") if r))


def _joined(*nas: str) -> str:
    return "; ".join(reasons_of("; ".join(nas)))


_TOKENS = attrgetter("tokens")
_FLOPS = attrgetter("flops")
_PEAK = attrgetter("peak_flops")
_SOURCE = attrgetter("peak_source")
_WORK = attrgetter("work")


def _sum_predicted(works: list[Work]) -> float | None:
    """The works' predicted FLOPs added up in their order (None when one is unknown): one
    figure repeated when every rank's terms are the same (the usual job), else one figure per
    distinct set of terms."""
    terms = list(map(_PREDICTED_TERMS, works))
    predicted = {t: _predicted(*t) for t in set(terms)}
    if len(predicted) == 1:
        (one,) = predicted.values()
        return None if one is None else sum(repeat(one, len(works)))
    if None in predicted.values():
        return None
    return sum(map(predicted.__getitem__, terms))  # type: ignore[arg-type]


def _of_every_work(works: list[Work | None], seconds: float) -> Throughput | None:
    """:func:`of_step` where every rank reported its tokens, FLOPs and peak (a real job's
    common case), None otherwise. Each figure is one C-level pass over the works, summed in
    the same order as :func:`of_step` sums them (bit-equal); the predicted FLOPs are worked out
    once per distinct set of terms (a job's ranks share one model), then summed per rank. At
    16,384 ranks (bench/view_ingest.py --relayed --work) ``cluster_step`` read ~13 ms of the
    step's close against ~21 with a Python call per rank: each pass over 16,384 reports costs
    ~1-2 ms whatever it computes (the reports are scattered in memory), so fewer passes is
    what counts."""
    try:
        sum_tokens: int = sum(map(_TOKENS, works))
        sum_flops: float = sum(map(_FLOPS, works))
        sum_peaks: float = sum(map(_PEAK, works))
    except (TypeError, AttributeError):  # a figure or a whole work is None: the general path
        return None
    sum_predicted = _sum_predicted(works)
    mfu, na = _mfu(sum_flops / seconds, sum_peaks, "")
    return Throughput(
        tokens_per_s=sum_tokens / seconds,
        tflops_per_s=sum_flops / seconds / 1e12,
        mfu=mfu,
        peak_tflops=sum_peaks / 1e12,
        peak_source="; ".join(sorted(set(map(_SOURCE, works)))),
        flops_per_step=sum_flops,
        predicted_flops_per_step=sum_predicted,
        tokens_per_step=sum_tokens,
        na=na,
    )


def of_step(works: list[Work | None], seconds: float) -> Throughput:
    """The figures of one step done by ``works`` (one rank's, or every rank's) in ``seconds``."""
    if works and seconds > 0:
        every = _of_every_work(works, seconds)
        if every is not None:
            return every
    # A cluster step's works are every rank's (16,384 at the largest jobs, ~25 ms of a step's
    # close): a reason is asked only of a work some reason holds for (the others say ""), each
    # distinct reason joined once, and each sum taken over its list as it is (no None in it).
    said = dict.fromkeys(
        _reason(w)
        for w in works
        if w is None or w.tokens is None or w.flops is None or w.peak_flops is None
    )
    reasons = [r for r in [_joined(*said)] if r]
    known = [w for w in works if w is not None]
    if not works or not known or seconds <= 0:
        return Throughput(na=reasons[0] if reasons else "no step time")
    tokens = [w.tokens for w in known]
    flops = [w.flops for w in known]
    peaks = [w.peak_flops for w in known]
    predicted = [predicted_flops(w) for w in known]
    whole = len(known) == len(works)
    sum_tokens = sum(cast("list[int]", tokens)) if whole and None not in tokens else None
    sum_flops = sum(cast("list[float]", flops)) if whole and None not in flops else None
    sum_peaks = sum(cast("list[float]", peaks)) if whole and None not in peaks else None
    sources = sorted({w.peak_source for w in known if w.peak_flops is not None})
    mfu, na = _mfu(
        None if sum_flops is None else sum_flops / seconds,
        sum_peaks,
        reasons[0] if reasons else "",
    )
    return Throughput(
        tokens_per_s=None if sum_tokens is None else sum_tokens / seconds,
        tflops_per_s=None if sum_flops is None else sum_flops / seconds / 1e12,
        mfu=mfu,
        peak_tflops=None if sum_peaks is None else sum_peaks / 1e12,
        peak_source="; ".join(sources),
        flops_per_step=sum_flops,
        predicted_flops_per_step=(
            sum(cast("list[float]", predicted)) if whole and None not in predicted else None
        ),
        tokens_per_step=sum_tokens,
        na=na,
    )


def rank_step(summary: StepSummary) -> Throughput:
    """One rank's figures in one step (its own step time)."""
    return of_step([summary.work], summary.train_s)


def cluster_step(agg: StepAggregate) -> Throughput:
    """The cluster's figures in one step: the ranks' work over the step's time."""
    ranks = sorted(agg.summaries)
    return of_step(list(map(_WORK, map(agg.summaries.__getitem__, ranks))), agg.train_time)


def reported_step(agg: StepAggregate) -> Throughput | None:
    """:func:`cluster_step` of a step some rank reported its work in, else None (a trace from
    before the figures existed). A closed step's is worked out once: its reports are final,
    and the header asks for the newest step's every frame (a pass over every rank's work:
    ~30 ms at 16,384 ranks)."""
    cached = agg.reported_throughput
    if cached is not None and agg.complete:
        return cached[0]
    found = None
    if any(s.work is not None for s in agg.summaries.values()):
        found = cluster_step(agg)
    if agg.complete:
        agg.reported_throughput = (found,)
    return found


def _steady(points: list[tuple[float, list[Work | None]]]) -> Throughput:
    """Figures over several steps: each step's work summed, over the summed times of the steps
    that measured it. A step whose FLOPs were not counted (a shape past the agent's counts, a
    rank that said nothing) is left out of TFLOP/s and MFU, and one without tokens out of
    tokens/s, rather than making the run's figure NA: a job with variable-length batches
    counts most of its steps, not all. ``over`` then says how many steps each figure rests on
    and why the rest are out; a figure no step measured stays NA with the reason."""
    if not points:
        return Throughput(na="no steady step yet")
    steps = [(of_step(works, seconds), seconds) for seconds, works in points if seconds > 0]
    if not steps:
        return Throughput(na="no step time")
    tokens = [(s, t) for s, t in steps if s.tokens_per_step is not None]
    counted = [(s, t) for s, t in steps if s.flops_per_step is not None]
    peaked = [(s, t) for s, t in counted if s.peak_tflops is not None]

    def rate(part: list[tuple[Throughput, float]], value: str) -> float | None:
        seconds = sum(t for _, t in part)
        return sum(getattr(s, value) for s, _ in part) / seconds if part else None

    flops_per_s = rate(counted, "flops_per_step")
    peak_s = sum(s.peak_tflops * 1e12 * t for s, t in peaked if s.peak_tflops is not None)
    peak = peak_s / sum(t for _, t in peaked) if peaked else None
    # flops / peak_time is MFU; as a rate: the counted steps' FLOP/s over their time-weighted peak.
    mfu, mfu_na = _mfu(rate(peaked, "flops_per_step"), peak, _why(steps, peaked))
    tokens_per_s = rate(tokens, "tokens_per_step")
    reasons = [
        _why(steps, tokens) if tokens_per_s is None else "",
        _why(steps, counted) if flops_per_s is None else "",
        mfu_na if mfu is None else "",
    ]
    last = steps[-1][0]
    return Throughput(
        tokens_per_s=tokens_per_s,
        tflops_per_s=None if flops_per_s is None else flops_per_s / 1e12,
        mfu=mfu,
        # The peak MFU divides by (the counted steps' time-weighted peak), not the last step's:
        # a last step one rank's report of which was lost read half of it beside the MFU.
        peak_tflops=peak / 1e12 if peak else last.peak_tflops,
        peak_source=last.peak_source,
        flops_per_step=last.flops_per_step,
        predicted_flops_per_step=last.predicted_flops_per_step,
        tokens_per_step=last.tokens_per_step,
        na=_joined(*reasons),
        over=_coverage(steps, tokens, counted, peaked),
    )


def _why(steps: list[tuple[Throughput, float]], part: list[tuple[Throughput, float]]) -> str:
    """Why the steps outside ``part`` are out of its figure (the first one's reason)."""
    used = {id(s) for s, _ in part}
    return next((s.na for s, _ in steps if id(s) not in used and s.na), "not measured")


def _coverage(
    steps: list[tuple[Throughput, float]],
    tokens: list[tuple[Throughput, float]],
    counted: list[tuple[Throughput, float]],
    peaked: list[tuple[Throughput, float]],
) -> str:
    """What the run's figures leave out, when they rest on some of the steps but not all (one
    clause a figure; empty when each rests on every step or on none)."""
    n = len(steps)
    named: dict[tuple[int, ...], tuple[list[str], list[tuple[Throughput, float]]]] = {}
    for name, part in (("tokens/s", tokens), ("TFLOP/s", counted), ("MFU", peaked)):
        if 0 < len(part) < n:  # figures over the same steps share one clause
            key = tuple(id(s) for s, _ in part)
            named.setdefault(key, ([], part))[0].append(name)
    return "; ".join(
        f"{' and '.join(names)} over {len(part)} of {n} steps (the rest: {_why(steps, part)})"
        for names, part in named.values()
    )


def _with_peak(work: Work | None, known: Work | None) -> Work | None:
    """``work`` with the peak of ``known`` (a later work of the same rank) where it went out
    before the rank's peak was found. The peak is one figure per process (agent/peak.py finds
    it once, on a thread, while the first steps run: on a loaded machine the matmul probe
    ends after step 2), so a run's MFU divides every step by it, not only the steps reported
    after the probe ended; one step's own figures (:func:`of_step`) stay as reported."""
    if work is None or work.peak_flops is not None or known is None:
        return work
    return msgspec.structs.replace(work, peak_flops=known.peak_flops, peak_source=known.peak_source)


def _last_peaks(works: list[tuple[int, Work | None]]) -> dict[int, Work]:
    """Each rank's last work that carried a peak, from ``(rank, work)`` in step order."""
    return {r: w for r, w in works if w is not None and w.peak_flops is not None}


def rank_run(rs: RankState, first_step: int | None) -> Throughput:
    """One rank over its steady steps held in history (every step but the run's first,
    ``first_step``; that one alone when it is the only)."""
    history = list(rs.history)
    steady = [s for s in history if s.step != first_step] or history
    known = _last_peaks([(0, s.work) for s in steady]).get(0)
    return _steady([(s.train_s, [_with_peak(s.work, known)]) for s in steady])


def cluster_run(state: ClusterState) -> Throughput:
    """The cluster over its steady complete steps held (every step but the first)."""
    done = state.complete_steps()
    first = state.totals.first_step
    steady = [a for a in done if a.step != first] or done
    peaks = _last_peaks([(r, s.work) for a in steady for r, s in a.summaries.items()])
    return _steady(
        [
            (
                a.train_time,
                [_with_peak(a.summaries[r].work, peaks.get(r)) for r in sorted(a.summaries)],
            )
            for a in steady
        ]
    )
