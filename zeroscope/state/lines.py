"""Plain-text views of ClusterState: the headless line per step and the final summary.

``zeroscope run --headless`` prints these while the job runs; replaying its trace through the
same ClusterState prints the same lines, which is how the end-to-end test checks the trace.
"""

from __future__ import annotations

from . import units
from .alerts import interrupted
from .cluster import ClusterState, StepAggregate


def step_line(agg: StepAggregate) -> str:
    """step, step time, loss, loss scale, worst rank's P/G/O/A, exposed comm %, slowest rank."""
    worst = agg.worst_memory_rank
    w = agg.summaries[worst]
    slowest = agg.slowest_rank
    median = agg.median_time
    slower = agg.summaries[slowest].duration_s / median - 1 if median > 0 else None
    flags = " SKIPPED" if agg.skipped else ""
    return (
        f"step {agg.step:>5}  time {units.seconds(agg.step_time):>6}  "
        f"loss {units.number(agg.loss, '.4f'):>7}  scale {units.scale(agg.loss_scale):>6}  "
        f"mem r{worst} P {units.size(w.params)} G {units.size(w.grads)} "
        f"O {units.size(w.optim)} A {units.size(w.activations)}  "
        f"exposed {units.percent(agg.exposed_share):>4}  "
        f"slowest r{slowest}"
        + (f" (+{slower:.0%})" if slower is not None else "")
        + f"  ranks {len(agg.summaries)}{flags}"
    )


def summary_lines(state: ClusterState, trace: str | None = None) -> list[str]:
    """The final summary: totals, the worst figures of the run, and the alerts still standing."""
    done = state.complete_steps()
    lines = [f"job {state.job_id or 'NA'}: {_count_sentence(state)}"]
    if done:
        times = [a.step_time for a in done]
        skipped = sum(1 for a in done if a.skipped)
        last = done[-1]
        steps_s, samples_s = state.throughput()
        span = "" if len(done) == state.steps_completed else f" (last {len(done)} steps)"
        lines.append(
            f"time per step{span}: mean {units.seconds(sum(times) / len(times))}, "
            f"max {units.seconds(max(times))}; {skipped} skipped; "
            f"final loss {units.number(last.loss, '.4f')}, loss scale {units.scale(last.loss_scale)}; "
            f"{units.number(steps_s, '.2f')} steps/s, {units.number(samples_s, '.1f')} samples/s"
        )
        peak = max(done, key=lambda a: a.summaries[a.worst_memory_rank].device_total)
        r = peak.worst_memory_rank
        p = peak.summaries[r]
        lines.append(
            f"peak memory r{r} at step {peak.step}: P {units.size(p.params)} "
            f"G {units.size(p.grads)} O {units.size(p.optim)} A {units.size(p.activations)} "
            f"host {units.size(p.host_bytes)}"
        )
    for alert in state.alerts():
        # After the job, silence is its end, not a warning; lost ranks get their own line.
        if alert.kind not in ("silent", "lost"):
            lines.append(f"alert: {alert.message}")
    lines += exit_lines(state)
    if trace:
        lines.append(f"trace: {trace}")
    return lines


def exit_lines(state: ClusterState) -> list[str]:
    """How the ranks ended. A rank without a Bye while others said theirs died without a word
    (SIGKILL, the OOM killer, a segfault): it is the likely first failure, and the others'
    errors (a peer's connection reset) follow from it. Each lost rank is named with the last
    step it completed."""
    ranks = sorted(state.ranks.items())
    exits = {r: rs.bye.exit_code for r, rs in ranks if rs.bye}
    lost: dict[int, list[int]] = {}
    for r, rs in ranks:
        if rs.bye is None:
            lost.setdefault(rs.latest.step if rs.latest else 0, []).append(r)
    lines = []
    if exits:
        for step, rs_lost in sorted(lost.items()):
            shown = ",".join(f"r{r}" for r in rs_lost[:8]) + (
                f" +{len(rs_lost) - 8}" if len(rs_lost) > 8 else ""
            )
            lines.append(
                f"rank {shown} died without a word after step {step} (killed or crashed: no Bye)"
            )
        bad = {r: c for r, c in exits.items() if c}
        lines += _error_sentences(state, bad) if bad else ["all ranks exited cleanly"]
    elif lost:
        last = max(lost)
        when = f"after step {last}" if last else "before step 1"
        lines.append(f"no rank said Bye: the job or its recording ended abruptly {when}")
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _count_sentence(state: ClusterState) -> str:
    """ "12 steps on 2 ranks", in words that also fit a job that never got going."""
    steps, ranks = state.steps_completed, len(state.ranks)
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
    stopped = sorted(r for r, bye in byes.items() if bye and interrupted(bye.message))
    order = sorted(set(bad) - set(stopped), key=lambda r: (byes[r].wall_ns, r))  # type: ignore[union-attr]
    shown = ",".join(f"r{r}" for r in stopped[:8]) + (
        f" +{len(stopped) - 8}" if len(stopped) > 8 else ""
    )
    lines = [f"{shown} stopped by KeyboardInterrupt"] if stopped else []
    for r in order[:ERRORS_NAMED]:
        message = byes[r].message.rstrip().removesuffix(":")  # type: ignore[union-attr]
        lines.append(f"rank {r} exited with code {bad[r]}" + (f": {message}" if message else ""))
    if len(order) > ERRORS_NAMED:
        rest = len(order) - ERRORS_NAMED
        lines.append(f"{_plural(rest, 'more rank')} exited with an error")
    return lines
