"""Plain-text views of ClusterState: the headless line per step and the final summary.

``zeroscope run --headless`` prints these while the job runs; replaying its trace through the
same ClusterState prints the same lines, which is how the end-to-end test checks the trace.
"""

from __future__ import annotations

from . import units
from .alerts import interrupted, ranks_text
from .cluster import ClusterState, StepAggregate
from .pipeline import layout_of
from .roster import headcount
from .throughput import cluster_run, cluster_step, reasons_of, reported_step
from .totals import ClusterTotals


def step_line(agg: StepAggregate) -> str:
    """step, step time, mean loss, gradient norm (where some rank reported one), loss scale,
    worst rank's P/G/O/A on the device (and what it offloaded to host memory or NVMe), the
    cluster's exposed comm %, and the rank with the most compute beyond the others (its
    excess)."""
    worst = agg.worst_memory_rank
    w = agg.summaries[worst]
    slowest = agg.slowest_rank
    excess = agg.slowest_excess
    flags = " SKIPPED" if agg.skipped else ""
    evaluation = agg.eval_time
    norm = agg.grad_norm
    return (
        f"step {agg.step:>5}  time {units.seconds(agg.step_time):>6}  "
        # An evaluation ran before the step, in its time: said, or the step reads as slow.
        + (f"(eval {units.seconds(evaluation)})  " if evaluation is not None else "")
        + f"loss {units.number(agg.loss, '.4f'):>7}  "
        # The gradient norm where the job clips (or DeepSpeed says it): a loss spike's context.
        + (f"gnorm {units.number(norm, '.4g'):>6}  " if norm is not None else "")
        + f"scale {units.scale(agg.loss_scale):>6}  "
        f"mem r{worst} P {units.params_size(w.params, w.frozen_params)} G {units.size(w.grads)} "
        f"O {units.size(w.optim)} A {units.size(w.activations)}"
        # Offloaded parts live in host memory: say how much, or O 0B reads as no optimizer.
        + (f" host {units.size(w.host_bytes)}" if w.host_bytes else "")
        + (f" nvme {units.size(w.nvme_bytes)}" if w.nvme_bytes else "")
        + f"  exposed {units.percent(agg.exposed_share):>4}  "
        + throughput_text(agg)
        + ("  slowest NA" if slowest is None else f"  slowest r{slowest}")
        + (f" (+{units.seconds(excess)} compute)" if excess is not None and excess > 0 else "")
        + f"  ranks {len(agg.summaries)}{flags}"
    )


def throughput_text(agg: StepAggregate) -> str:
    """The step's cluster tokens/s, TFLOP/s and MFU (zeroscope.state.throughput)."""
    t = cluster_step(agg)
    return (
        f"tok/s {units.count(t.tokens_per_s)}  {units.flop_rate(t.tflops_per_s)}  "
        f"MFU {units.fine_percent(t.mfu)}"
    )


def header_throughput(state: ClusterState) -> str | None:
    """The header's tokens/s, model FLOP/s and MFU of the newest step; None when no rank of it
    reports its tokens and FLOPs (a trace from before they existed: the header stays as was)."""
    latest = state.latest()
    t = None if latest is None else reported_step(latest)
    if t is None:
        return None
    return (
        f"{units.count(t.tokens_per_s)} tok/s {units.flop_rate(t.tflops_per_s)} "
        f"MFU {units.fine_percent(t.mfu)}"
    )


def step_lines(state: ClusterState, closed: list[StepAggregate], before: int | None) -> list[str]:
    """The lines of the steps ``closed`` by one message, ``before`` being the newest step closed
    until then: a step no report of which ever arrived (every rank's was dropped on its way:
    counted, never silent) gets a line saying so where its own would have been, so a reader
    of the step lines never mistakes a hole for a run that skipped steps. Where a step's
    tokens/s, FLOP/s or MFU read NA for a reason not said yet in the run, a line under it says
    the reason (the peak still being measured, shapes past the FLOP counts), once."""
    lines = []
    last = before or 0
    for agg in closed:
        if agg.step > last + 1:
            lines.append(missing_steps_line(state, last + 1, agg.step - 1))
        lines.append(step_line(agg))
        reported = reported_step(agg)  # None: no rank reports work (no figures to explain)
        for why in reasons_of(reported.na) if reported is not None else []:
            if why not in state.throughput_na_said:  # once a reason: a line says it
                state.throughput_na_said.add(why)
                lines.append(f"{'':11}NA from step {agg.step}: {why}")
        last = agg.step
    return lines


def missing_steps_line(state: ClusterState, first: int, last: int) -> str:
    """One line for steps ``first``..``last``, of which no rank's report arrived."""
    which = f"step {first}" if first == last else f"steps {first}-{last}"
    dropped = sum(rs.dropped for rs in state.ranks.values())
    why = (
        f"the agents dropped {dropped} messages so far"
        if dropped
        else "none was counted as dropped"
    )
    return f"no report of {which} reached zeroscope ({why})"


THINNED_FIGURES = (
    "figures from thinned data: per-step means and peaks are over the kept steps, steps/s "
    "and samples/s count the step numbers"
)


def summary_lines(state: ClusterState, trace: str | None = None) -> list[str]:
    """The final summary: the run's figures (zeroscope.state.totals: steady steps), the worst
    memory, and the alerts still standing."""
    done = state.complete_steps()
    t = state.totals
    engine = "" if state.engine in ("", "zeroscope") else f" ({state.engine})"
    lines = [f"job {state.job_id or 'NA'}: {_count_sentence(state)}" + engine]
    if state.thinned:
        lines.append(f"{state.thinned}; {THINNED_FIGURES}")
    lines += missing_lines(state)
    if done:
        last = done[-1]
        lines.append(
            f"time per step {units.seconds(t.mean_step_s)} (steady steps); "
            f"{t.skipped} skipped; final loss {units.number(last.loss, '.4f')} "
            f"({_whose_loss(state, last)}), "
            f"loss scale {units.scale(last.loss_scale)}; "
            + _grad_norm_text(t)
            + f"{units.number(t.steps_per_s, '.3f')} steps/s, "
            f"{units.number(t.samples_per_s, '.2f')} samples/s; "
            f"exposed comm {units.percent(t.exposed_share)}"
        )
        if t.samples_na:
            lines.append(f"samples/s NA: {t.samples_na}")
        w = cluster_run(state)
        lines.append(
            throughput_line(
                w.tokens_per_s, w.tflops_per_s, w.mfu, w.peak_tflops, w.peak_source, w.over, w.na
            )
        )
        peak = max(done, key=lambda a: a.summaries[a.worst_memory_rank].device_total or 0)
        r = peak.worst_memory_rank
        p = peak.summaries[r]
        lines.append(
            f"peak memory r{r} at step {peak.step}: P {units.params_size(p.params, p.frozen_params)} "
            f"G {units.size(p.grads)} O {units.size(p.optim)} A {units.size(p.activations)} "
            f"host {units.size(p.host_bytes)}"
        )
    for alert in state.alerts():
        # After the job, silence is its end, not a warning; lost and missing ranks get their
        # own lines.
        if alert.kind not in ("silent", "lost", "missing"):
            lines.append(f"alert: {alert.message}")
    lines += exit_lines(state)
    if trace:
        lines.append(f"trace: {trace}")
    return lines


def throughput_line(
    tokens_per_s: float | None,
    tflops_per_s: float | None,
    mfu: float | None,
    peak_tflops: float | None,
    peak_source: str,
    over: str,
    na: str,
) -> str:
    """The run's model throughput (zeroscope.state.throughput ``cluster_run``), as the final
    summary and ``zeroscope summary`` say it: tokens/s, model FLOP/s, MFU of the peak, what a
    figure rests on and why one is NA."""
    peak = "" if peak_tflops is None else f" of {units.flop_rate(peak_tflops)} peak ({peak_source})"
    return (
        f"model throughput {units.count(tokens_per_s)} tokens/s, "
        f"{units.flop_rate(tflops_per_s)}, MFU {units.fine_percent(mfu)}"
        + peak
        + (f"; {over}" if over else "")
        + (f"; NA: {na}" if na else "")
    )


def missing_lines(state: ClusterState) -> list[str]:
    """Ranks of the job that never reported, one line per node and reason, with the reason
    (state/roster.py): a view of half the cluster must say so. No grace period here: the job
    has ended."""
    groups = state.missing()
    if not groups:
        return []
    reported, world = headcount(state)
    head = f"missing ranks: {world - reported} of {world} never reported"
    return [head, *(f"  missing {g.text}" for g in groups)]


def exit_lines(state: ClusterState) -> list[str]:
    """How the ranks ended. A rank without a Bye while others said theirs died without a word
    (SIGKILL, the OOM killer, a segfault): it is the likely first failure, and the others'
    errors (a peer's connection reset) follow from it. Each lost rank is named with the last
    step it completed. A Bye leaves as the rank's Python exits: a crash after it (an abort in
    torch's teardown) shows only in the job's exit code, so "cleanly" says what it rests on.
    A trace ``zeroscope run`` recorded also holds the launcher's end (``state.job_end``,
    zeroscope.state.ending): said first, and a stop on request is said as one."""
    ranks = sorted(state.ranks.items())
    exits = {r: rs.bye.exit_code for r, rs in ranks if rs.bye}
    lost: dict[int, list[int]] = {}
    for r, rs in ranks:
        if rs.bye is None:
            lost.setdefault(rs.latest.step if rs.latest else 0, []).append(r)
    end = state.job_end
    if end is not None and end.stopped:  # the Byes of a stopped job may never have come
        last = max((rs.latest.step for _, rs in ranks if rs.latest), default=0)
        return [f"job stopped on request ({end.stopped}) after step {last}"]
    # The launcher's word first (a Bye cannot carry sys.exit's code); the Byes add the rest.
    lines = [] if end is None else end.sentences()
    if exits:
        for step, rs_lost in sorted(lost.items()):
            shown = ranks_text(rs_lost, 8)
            lines.append(
                f"rank {shown} died without a word after step {step} (killed or crashed: no Bye)"
            )
        bad = {r: c for r, c in exits.items() if c}
        if bad:
            lines += _error_sentences(state, bad)
        elif end is None or end.code == 0:
            lines.append(
                "the ranks that said Bye exited cleanly (exit code 0 in each)"
                if lost
                else "all ranks exited cleanly (exit code 0 in every Bye)"
            )
    elif lost and end is not None and end.code:
        last = max(lost)
        lines.append(f"no rank said Bye after step {last}" if last else "no rank said Bye")
    elif lost:
        last = max(lost)
        when = f"after step {last}" if last else "before step 1"
        lines.append(f"no rank said Bye: the job or its recording ended abruptly {when}")
    return lines


def _grad_norm_text(t: ClusterTotals) -> str:
    """The run's gradient norm: the final one and the largest (its step), where any was."""
    if t.grad_norm_final is None and t.grad_norm_max is None:
        return ""
    largest = (
        ""
        if t.grad_norm_max is None
        else f" (largest {units.number(t.grad_norm_max, '.4g')} at step {t.grad_norm_max_step})"
    )
    return f"grad norm {units.number(t.grad_norm_final, '.4g')}{largest}; "


def _whose_loss(state: ClusterState, last: StepAggregate) -> str:
    """Whose losses the final step's mean is over: "rank mean"; the last pipeline stage's ranks
    when exactly they reported it (the only stage that computes a loss); else the ranks named
    when fewer than the job's reported it (a rank that died: the mean of one rank read as the
    cluster's)."""
    with_loss = sorted(r for r, s in last.summaries.items() if s.loss is not None)
    world = max(state.world_size, len(state.ranks))
    if not with_loss or len(with_loss) >= world:
        return "rank mean"
    named = ranks_text(with_loss, 4)
    if set(with_loss) == _last_stage(state):
        return f"last pipeline stage: {named}"
    return f"{named} only: {len(with_loss)} of {world} ranks at step {last.step}"


def _last_stage(state: ClusterState) -> set[int]:
    """The ranks running a pipeline's last stage (empty without a pipeline layout): the one
    holding stage ``num_stages - 1`` where the layout lists its stages (a V-shaped schedule
    puts it on the first pipeline rank), else the last pipeline rank."""
    out = set()
    for r, rs in state.ranks.items():
        layout = layout_of(rs.hello)
        if layout is None or layout.pp_size <= 1:
            continue
        if layout.stages and layout.num_stages:
            last = layout.num_stages - 1 in layout.stages
        else:
            last = layout.pp == layout.pp_size - 1
        if last:
            out.add(r)
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _count_sentence(state: ClusterState) -> str:
    """ "12 steps on 2 ranks", in words that also fit a job that never got going."""
    steps, ranks = state.totals.steps, len(state.ranks)
    if not ranks:
        return "no rank reported"
    if not steps:
        return f"{_plural(ranks, 'rank')} reported, no step completed"
    return f"{_plural(steps, 'step')} on {_plural(ranks, 'rank')}"


ERRORS_NAMED = 3
"""Ranks whose exit error is spelled out; the rest are counted."""


def _error_sentences(state: ClusterState, bad: dict[int, int]) -> list[str]:
    """One sentence per failed rank, in the order they said so (the first is the likely
    cause), with the error each rank reported; past a few, a count."""
    byes = {r: state.ranks[r].bye for r in bad}
    stops: dict[str, list[int]] = {}
    for r, bye in sorted(byes.items()):
        stop = interrupted(bye.message) if bye else None
        if stop:
            stops.setdefault(stop, []).append(r)
    stopped = {r for ranks in stops.values() for r in ranks}
    order = sorted(set(bad) - stopped, key=lambda r: (byes[r].wall_ns, r))  # type: ignore[union-attr]
    lines = [f"{ranks_text(ranks, 8)} stopped by {stop}" for stop, ranks in stops.items()]
    for r in order[:ERRORS_NAMED]:
        message = byes[r].message.rstrip().removesuffix(":")  # type: ignore[union-attr]
        lines.append(f"rank {r} exited with code {bad[r]}" + (f": {message}" if message else ""))
    if len(order) > ERRORS_NAMED:
        rest = len(order) - ERRORS_NAMED
        lines.append(f"{_plural(rest, 'more rank')} exited with an error")
    return lines
