"""``serve``'s progress: one line per completed step, as ``zeroscope run --headless`` prints.

A job started by ``serve -- torchrun ...`` (or by a scheduler beside ``serve``) ran with no sign
of life from zeroscope until it ended. The lines go to stderr: the job owns stdout (``serve --
cmd`` hands its own stdout to the job, and without a command stdout carries the export line a
script reads), and each line is written whole.
"""

from __future__ import annotations

import sys
from typing import TextIO

from zeroscope.agent.schema import Message
from zeroscope.run.launch import QueueSource
from zeroscope.state.viewmodel import ClusterState, receive_now, step_line


class StepLines:
    """Collector listener + printer: ``see`` runs on the collector's thread, ``print_due`` on
    serve's main thread (the state is only touched there)."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self._source = QueueSource()
        self._state = ClusterState()
        self._stream = stream
        self._quiet = quiet

    def see(self, message: Message) -> None:
        if not self._quiet:
            self._source.put(message)

    def print_due(self, timeout: float) -> None:
        """Lines for the steps completed since the last call (waits up to ``timeout``)."""
        now = receive_now()
        for message in self._source.poll(timeout):
            for agg in self._state.ingest(message, now):
                self._say(step_line(agg))

    def finish(self) -> None:
        """The last steps: what arrived, then those the state held back for late ranks."""
        self.print_due(0)
        for agg in self._state.flush():
            self._say(step_line(agg))

    def _say(self, line: str) -> None:
        stream = self._stream or sys.stderr
        try:
            stream.write(line + "\n")
            stream.flush()
        except (BrokenPipeError, ValueError):
            self._quiet = True  # nobody reads it any more: the job goes on
