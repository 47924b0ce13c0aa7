"""The job header: who runs what, where it is, how fast."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from zeroscope.state import units
from zeroscope.state.viewmodel import ClusterState, headcount, header_throughput


def header_segments(
    state: ClusterState, status: str = "", shown: tuple[int, int] | None = None
) -> list[tuple[str, str]]:
    """(text, style) pieces: job, status (REPLAY, job exited ...: right after the job, so
    that at 80 columns, where the header wraps and keeps two lines, it is never the piece cut
    off), world size (or, under a filter, how many ranks it shows), stage, precision, offload,
    step, steps/s, samples/s, the newest step's tokens/s, model FLOP/s and MFU (once ranks
    report them); NA until known."""
    c = state.config
    latest = state.latest()
    steps_s, samples_s = state.throughput()
    reported, world = headcount(state)
    segments = [
        (f"{state.job_id or 'NA'}", "bold"),
        # Until every rank of the job reported, say how many did (the alert says why).
        (f"{world} ranks", "") if reported >= world else (f"ranks {reported}/{world}", "bold red"),
    ]
    if shown is not None:
        segments[1] = (f"{shown[0]} of {shown[1]} ranks shown (filter)", "bold yellow")
    if status:
        segments.insert(1, (status, "bold cyan"))
    if state.thinned:
        # A thinned trace's replay: its older steps are every k-th (docs/trace-format.md).
        segments.insert(2 if status else 1, (state.thinned.split(" (")[0], "yellow"))
    if c is not None:
        offload = (
            c.offload_optimizer
            if c.offload_param == "none"
            else (f"{c.offload_optimizer}+param {c.offload_param}")
        )
        engine = "" if state.engine in ("", "zeroscope") else f"{state.engine} "
        segments.append((f"{engine}ZeRO-{c.stage} {c.precision} offload {offload}", ""))
    else:
        segments.append(("config NA", ""))
    shape = state.mesh_shape()
    if shape:
        segments.append((shape, ""))
    segments.append((f"step {latest.step if latest else 'NA'}", "bold"))
    segments.append(
        (f"{units.number(steps_s, '.2f')} steps/s {units.number(samples_s, '.1f')} samples/s", "")
    )
    throughput = header_throughput(state)  # tokens/s, model FLOP/s, MFU once ranks report them
    if throughput:
        segments.append((throughput, ""))
    return segments


def header_text(
    state: ClusterState,
    status: str = "",
    width: int = 200,
    shown: tuple[int, int] | None = None,
) -> Text:
    """The segments joined by │, wrapped only between segments (two lines at 80 columns)."""
    text = Text(" zeroscope ", style="bold reverse")
    column = len(text)
    for i, (piece, style) in enumerate(header_segments(state, status, shown)):
        sep = " " if i == 0 else " │ "
        if column + len(sep) + len(piece) > width:
            text.append("\n ")
            column = 1
            sep = ""
        text.append(sep)
        text.append(piece, style=style)
        column += len(sep) + len(piece)
    return text


class ClusterHeader(Widget):
    DEFAULT_CSS = """
    ClusterHeader { height: auto; max-height: 2; background: $panel; }
    """

    def __init__(self) -> None:
        super().__init__()
        self._state: ClusterState | None = None
        self._status = ""
        self._shown: tuple[int, int] | None = None
        self._lines = 0
        self._text: tuple[int, Text] | None = None
        """(width, text) last shown: a redraw that changes no figure repaints nothing."""

    def show(
        self, state: ClusterState, status: str = "", shown: tuple[int, int] | None = None
    ) -> None:
        """``shown``: (ranks shown, ranks) while a filter hides some. The header is repainted
        only when its text changed, and laid out again only when its line count did: a layout
        pass reflows the whole screen, and the live view redraws the header every second."""
        self._state, self._status, self._shown = state, status, shown
        width = self.content_size.width
        if not width:
            self._text = None
            self._lines = 0
            self.refresh(layout=True)
            return
        drawn = self._text
        text = self._header(width)
        if drawn is not None and drawn == (width, text):
            return
        self._text = (width, text)
        lines = text.plain.count("\n") + 1
        self.refresh(layout=lines != self._lines)
        self._lines = lines

    def _header(self, width: int) -> Text:
        assert self._state is not None
        return header_text(self._state, self._status, width, self._shown)

    def render(self) -> Text:
        if self._state is None:
            return Text(" zeroscope ", style="bold reverse")
        width = self.content_size.width or 80
        if self._text is None or self._text[0] != width:
            self._text = (width, self._header(width))
        return self._text[1]
