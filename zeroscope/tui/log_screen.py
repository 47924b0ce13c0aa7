"""Log: the job's own output (what its ranks print, torchrun's messages), followed live.

Under the TUI the job writes to ``runs/<job>.log`` beside the trace (zeroscope run); this
screen tails that file in a thread worker (file I/O never on the UI thread) and appends what
arrives. Replay shows the log recorded beside the trace, when there is one.
"""

from __future__ import annotations

import os
import time

from textual import work
from textual.app import ComposeResult
from textual.widgets import Footer, Log, Static
from textual.worker import get_current_worker

from .base import StateScreen
from .header import ClusterHeader

TAIL_BYTES = 1 << 20
"""At most the last MiB of an existing log is shown (the whole file stays on disk)."""
POLL_S = 0.25


class LogScreen(StateScreen):
    DEFAULT_CSS = """
    LogScreen #log-path { height: 1; padding: 0 1; background: $boost; }
    LogScreen Log { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__(name="log")

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        yield Static(id="log-path")
        yield Log(max_lines=20_000, auto_scroll=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        path = self.zapp.log_path
        self.query_one("#log-path", Static).update(
            (
                f"the job's output: {path} (followed live)"
                if self.zapp.replay is None
                else f"the job's output, recorded beside the trace: {path}"
            )
            if path
            else "no log here: the job's output goes to the terminal that started it "
            "(headless, serve) or was not recorded beside this trace"
        )
        self.query_one(Log).focus()
        self.refresh_view()
        if path:
            self._follow(path)

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())

    @work(thread=True, exclusive=True, name="log-follow")
    def _follow(self, path: str) -> None:
        """Read the file's tail, then what is appended, until the screen goes away. A file
        that is replaced or truncated (a new job) is read again from its start."""
        worker = get_current_worker()
        position = 0
        first = True
        partial = ""
        while not worker.is_cancelled:
            try:
                size = os.path.getsize(path)
            except OSError:
                time.sleep(POLL_S)
                continue
            if size < position:
                position, partial = 0, ""
            if size > position:
                with open(path, "rb") as f:
                    if first and size > TAIL_BYTES:
                        position = size - TAIL_BYTES
                    f.seek(position)
                    data = f.read(size - position)
                position = size
                text = partial + data.decode("utf-8", errors="replace")
                lines = text.split("\n")
                partial = lines.pop()  # an unfinished last line waits for its end
                if first and position > TAIL_BYTES and lines:
                    lines = lines[1:]  # the tail's first line is cut
                if lines and not worker.is_cancelled:
                    self.app.call_from_thread(self._append, lines)
            first = False
            time.sleep(POLL_S)

    def _append(self, lines: list[str]) -> None:
        self.query_one(Log).write_lines(lines)
