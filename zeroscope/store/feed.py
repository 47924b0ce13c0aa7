"""The one way a recorded trace becomes a ClusterState: every reader of a trace (``summary``,
``export``, ``replay --headless``, ``advise`` and the advice trial) folds it through
:func:`feed_trace`, so their figures come from the same messages in the same order.

The order is the collector's: every rank's hello first, then the collector's admissions (a
refused or unheard rank is named by its admission alone, and without it a report could not
say which ranks are missing), then the messages as recorded; the job's end closes the steps
still waiting for reports that will never come (:meth:`ClusterState.flush`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from zeroscope.agent.schema import Message

if TYPE_CHECKING:
    from zeroscope.state import ClusterState, StepAggregate
    from zeroscope.store.trace import TraceReader


def preamble(reader: TraceReader) -> list[Message]:
    """What is folded in before the first report: every hello, then the collector's admissions
    (an older trace, or a test double, has none)."""
    return [*reader.hellos(), *getattr(reader, "admissions", list)()]


def feed_trace(
    reader: TraceReader, state: ClusterState
) -> Iterator[tuple[Message | None, list[StepAggregate]]]:
    """Fold the whole trace into ``state``, yielding each recorded message with the steps it
    completed; the last item is ``(None, the steps the job's end closed)``. Hellos and
    admissions are ingested first and not yielded."""
    job_id = getattr(reader, "job_id", "")
    if job_id:
        state.job_id = job_id  # named even when no rank reported
    state.job_end = getattr(reader, "job_end", None)
    note = getattr(reader, "thinned_note", None)
    if note:
        # A thinned trace (store/thinning.py): every figure says it comes from kept steps.
        state.thinned = note
        state.totals.thinned = True
    for message in preamble(reader):
        state.ingest(message)
    for message in reader.messages():
        yield message, state.ingest(message)
    yield None, state.flush()


def state_of_trace(reader: TraceReader, state: ClusterState | None = None) -> ClusterState:
    """The ClusterState after the whole trace (a fresh one unless ``state`` is given)."""
    from zeroscope.state import ClusterState

    state = ClusterState() if state is None else state
    for _ in feed_trace(reader, state):
        pass
    return state


def state_of_file(path: Path) -> ClusterState:
    """The ClusterState after the trace file at ``path``. Raises TraceError for a bad file."""
    from zeroscope.store.trace import TraceReader

    with TraceReader(path) as reader:
        return state_of_trace(reader)
