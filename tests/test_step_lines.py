"""The headless step lines never hide a hole: steps of which no rank's report arrived get a line
saying so where theirs would have been (zeroscope/state/lines.py ``step_lines``)."""

from __future__ import annotations

from zeroscope.agent.schema import StepReport, Work
from zeroscope.state import ClusterState
from zeroscope.state.lines import step_lines


def report(rank: int, step: int, dropped: int = 0) -> StepReport:
    return StepReport(rank=rank, step=step, wall_ns=step, duration_s=0.01, dropped=dropped)


def lines_of(state: ClusterState, messages: list[StepReport]) -> list[str]:
    out: list[str] = []
    for m in messages:
        before = state.last_complete
        out += step_lines(state, state.ingest(m, 1.0), before)
    return out


def test_steps_no_report_of_which_arrived_are_named_in_their_place() -> None:
    state = ClusterState()
    # Steps 2-44 of both ranks were dropped (counted: 43 each, on the next report through).
    lines = lines_of(
        state,
        [report(0, 1), report(1, 1), report(0, 45, 43), report(1, 45, 43), report(0, 46)],
    )
    lines += step_lines(state, state.flush(), state.last_complete)
    assert [ln.split()[:2] for ln in lines] == [
        ["step", "1"],
        ["no", "report"],
        ["step", "45"],
        ["step", "46"],
    ]
    assert (
        lines[1]
        == "no report of steps 2-44 reached zeroscope (the agents dropped 86 messages so far)"
    )


def test_a_single_missing_step_and_an_uncounted_one_say_so() -> None:
    state = ClusterState()
    lines = lines_of(state, [report(0, 1), report(1, 1), report(0, 3), report(1, 3)])
    assert lines[1] == "no report of step 2 reached zeroscope (none was counted as dropped)"
    assert [ln.split()[1] for ln in lines if ln.startswith("step ")] == ["1", "3"]


def test_contiguous_steps_get_only_their_own_lines() -> None:
    state = ClusterState()
    msgs = [report(r, s) for s in range(1, 6) for r in (0, 1)]
    lines = lines_of(state, msgs)
    assert [int(ln.split()[1]) for ln in lines] == [1, 2, 3, 4, 5]


def test_why_a_steps_throughput_is_na_is_said_once_a_reason_under_its_first_line() -> None:
    """The peak probe still running (steps 1-2), then counted steps, then a shape past the FLOP
    counts (step 4, 5): each reason once, under the first step it explains."""
    measuring = Work(tokens=8, flops=1e9, peak_source="peak being measured")
    known = Work(tokens=8, flops=1e9, peak_flops=1e12, peak_source="measured")
    uncounted = Work(tokens=8, peak_flops=1e12, peak_source="measured", na="FLOPs not counted")
    state = ClusterState()
    msgs = [
        StepReport(rank=r, step=s, wall_ns=s, duration_s=0.01, work=w)
        for s, w in ((1, measuring), (2, measuring), (3, known), (4, uncounted), (5, uncounted))
        for r in (0, 1)
    ]
    lines = [ln.strip() for ln in lines_of(state, msgs)]
    assert [ln.split(":")[0].split()[:2] if ln.startswith("step") else ln for ln in lines] == [
        ["step", "1"],
        "NA from step 1: MFU: peak being measured",
        ["step", "2"],
        ["step", "3"],
        ["step", "4"],
        "NA from step 4: FLOPs not counted",
        ["step", "5"],
    ]


def test_each_of_several_reasons_is_said_once() -> None:
    """Inputs that are no token batches (tokens/s NA all run) while the peak is measured (MFU
    NA on the first steps): both said under step 1, neither again when the peak arrives."""
    first = Work(flops=1e9, peak_source="peak being measured", na="not a batch of sequences")
    later = Work(flops=1e9, peak_flops=1e12, peak_source="measured", na="not a batch of sequences")
    msgs = [
        StepReport(rank=r, step=s, wall_ns=s, duration_s=0.01, work=w)
        for s, w in ((1, first), (2, first), (3, later))
        for r in (0, 1)
    ]
    said = [ln.strip() for ln in lines_of(ClusterState(), msgs) if not ln.startswith("step")]
    assert said == [
        "NA from step 1: not a batch of sequences",
        "NA from step 1: MFU: peak being measured",
    ]
