"""``zeroscope replay TRACE``: the live view on a recorded trace (pause, step, seek, speed).

The trace is read through zeroscope.store.sources.TraceSource and fed to the very ClusterState and
screens the live view uses. ``--headless`` prints the same per-step lines and summary as
``zeroscope run --headless`` did while recording, which is how a trace is checked end to end.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zeroscope.state.viewmodel import ClusterState
    from zeroscope.store.sources import TraceSource
    from zeroscope.store.trace import TraceReader

HELP = "open the live view on a recorded trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", help="a .zstrace file written by zeroscope run / serve")
    parser.add_argument("--step", type=int, help="open paused at this step")
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="playback speed: 0.25, 0.5, 1 (4 steps a second, not the run's own pace), 2, 4, 8, "
        "16 or 64",
    )
    parser.add_argument("--headless", action="store_true", help="print the per-step lines")


def main(args: argparse.Namespace) -> int:
    from zeroscope.cli import CliError
    from zeroscope.store.gc_pause import raise_viewer_thresholds
    from zeroscope.store.sources import TraceSource
    from zeroscope.store.trace import TraceError

    raise_viewer_thresholds()  # a viewer process: rarer collections (store/gc_pause.py)
    try:
        source = TraceSource(args.trace)
    except TraceError as exc:
        raise CliError(str(exc)) from None
    try:
        if args.step is not None:  # open at a step the trace has (a step before the first
            # opened an empty view, every figure NA)
            args.step = min(max(args.step, source.first_step), source.last_step)
        if args.headless or not sys.stdout.isatty():
            return replay_headless(source)
        return replay_live(source, args.step, args.speed)
    finally:
        source.close()


def replay_headless(source: TraceSource) -> int:
    """Every step's line, then the summary: the trace read start to end, step by step."""
    from zeroscope.state.viewmodel import ClusterState, step_line, summary_lines
    from zeroscope.store.feed import feed_trace

    state = ClusterState()
    reader = source.reader
    for _, done in feed_trace(reader, state):
        for agg in done:
            print(step_line(agg))
    for line in summary_lines(state, str(reader.path)):
        print(line)
    return 0


def replay_state(reader: TraceReader) -> ClusterState:
    """The viewer's state before the trace's messages: what the trace says of itself."""
    from zeroscope.state.viewmodel import ClusterState

    state = ClusterState()
    state.job_id = reader.job_id
    if reader.thinned_note:
        # The header says the history is thinned; the rates count step numbers.
        state.thinned = reader.thinned_note
        state.totals.thinned = True
    if reader.damage:  # read from a salvaged copy: said on screen too, not only on stderr
        state.recording_error = reader.damage
    return state


def replay_live(source: TraceSource, step: int | None, speed: float) -> int:
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.feed import SPEEDS, ReplayFeed

    reader = source.reader
    if speed not in SPEEDS:
        from zeroscope.cli import CliError

        raise CliError(f"--speed must be one of {', '.join(f'{s:g}' for s in SPEEDS)}")
    feed = ReplayFeed(reader, start_step=step, paused=step is not None, speed=speed)
    state = replay_state(reader)
    ZeroscopeApp(state, feed, trace=str(reader.path)).run()
    return 0
