"""The history plots as a grid that fills the space it is given: as many charts as fit (each at
least MIN_WIDTH x MIN_HEIGHT cells), the most important first (plots.ORDER); ``n`` pages
through the rest when the terminal is small. Charts without data (no offload in the job) are
left out rather than drawn empty.

Charts are rebuilt only when their data moved (``key``), and while a job is live at most once
per ``min_interval_s`` (LIVE_INTERVAL_S: a plot of hundreds of steps gains nothing from redraws every second; the
rank table keeps its own pace) and one chart per frame: after the frame that shows the step's
table, the newest data goes to one chart, and to the next only once the paint that draws it is
over (``_advance``), so no screen update pays for five plotext builds (~10-20 ms each) and keys
stay answered between them; the charts catch up within five screen updates (~0.1 s). In replay (``min_interval_s`` 0) every chart takes the
new data at once, so the cursor moves in all of them together. A chart newly shown (first
frame, ``n``) or resized is drawn at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

from rich.text import Text
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Static

from .history_plot import Chart, HistoryPlot
from .plots import ORDER

MIN_WIDTH = 36
MIN_HEIGHT = 7
LIVE_INTERVAL_S = 10.0
"""While a job is live the charts take new data at most this often (the rank table and the
header show each step within a second): rebuilding them every second was ~11 % of a core at 8
ranks and 10 steps/s (bench/tui_cpu.py), more than the rest of the view together; every 5 s,
~2 % of the view's ~6.5 % at 160x48 under load (five plotext charts of ~10-20 ms each); every
10 s, ~1 %."""


class HistoryPlots(Widget):
    DEFAULT_CSS = """
    HistoryPlots { height: 1fr; min-height: 0; layout: grid; grid-gutter: 0 1; }
    HistoryPlots > #plots-more { height: 1; color: $text-muted; display: none; }
    """

    def __init__(
        self,
        charts: Callable[[], dict[str, Chart]],
        key: Callable[[], object],
        *,
        min_interval_s: float = 0.0,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self._charts = charts
        self._key = key
        self._cache: tuple[object, dict[str, Chart]] | None = None
        self.min_interval_s = min_interval_s
        self._shown_key: object = None
        self._drawn_at = -1e9
        self._data_shown = False
        """Some chart on screen has data: until then new data is drawn at once, not after
        ``min_interval_s`` (a live view's charts read "NA: nothing reported yet" for their
        first 10 s while the table showed hundreds of steps)."""
        self._pending = False
        self._in_flight: HistoryPlot | None = None
        """The chart handed new data and not yet painted: the next waits for it."""
        self._in_flight_at = 0.0
        self._handed = 0
        self.page = 0
        self.shown: list[str] = []
        """Names of the charts on screen now (tests read it)."""
        self.more = 0
        """Charts with data that do not fit on this page."""

    def compose(self) -> ComposeResult:
        for name in ORDER:
            yield HistoryPlot(partial(self.chart, name), drawn=self._drawn, id=f"plot-{name}")
        yield Static(id="plots-more")

    def chart(self, name: str) -> Chart:
        key = self._shown_key
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._charts())
        return self._cache[1][name]

    def on_mount(self) -> None:
        self.poke()

    def on_resize(self) -> None:
        self._arrange()

    def poke(self) -> None:
        """The state moved: redraw if the plotted data did (no faster than min_interval_s)."""
        key = self._key()
        if key == self._shown_key:
            return
        wait = self._drawn_at + self.min_interval_s - time.monotonic()
        if wait > 0 and self._data_shown:
            if not self._pending:
                self._pending = True
                self.set_timer(wait, self._due)
            return
        self._show(key)

    def _due(self) -> None:
        self._pending = False
        self.poke()

    def _show(self, key: object) -> None:
        self._shown_key = key
        self._drawn_at = time.monotonic()
        self._arrange()
        self._data_shown = any(self.chart(n).has_data() for n in self.shown)
        if self.min_interval_s <= 0:
            for plot in self.query(HistoryPlot):
                if plot.display and plot.data_key != key:
                    self._hand(plot)
                    plot.refresh()
        elif self._in_flight is None or self._drawn_at - self._in_flight_at > 1.0:
            # After the frame that shows the step (the table first), not in it; a chart in
            # flight hands on by itself (unless it never got painted).
            self._in_flight = None
            self.call_after_refresh(self._advance)

    def _drawn(self, plot: HistoryPlot) -> None:
        """A chart is being painted: once the paint is over, the next may take the new data."""
        if plot is self._in_flight:
            self._in_flight = None
            self.call_after_refresh(self._advance)

    def _advance(self) -> None:
        """Give the newest data to the chart shown whose data is oldest (in ORDER on a tie, so
        charts never starve when data moves faster than they catch up)."""
        if self._in_flight is not None:
            return
        stale = [p for p in self.query(HistoryPlot) if p.display and p.data_key != self._shown_key]
        if stale:
            plot = min(stale, key=lambda p: p.handed)
            self._hand(plot)
            self._in_flight, self._in_flight_at = plot, time.monotonic()
            plot.refresh()

    def _hand(self, plot: HistoryPlot) -> None:
        self._handed += 1
        plot.data_key, plot.handed = self._shown_key, self._handed

    def next_page(self) -> None:
        self.page += 1
        self._arrange()

    def _arrange(self) -> None:
        width, height = self.size.width, self.size.height
        names = [n for n in ORDER if self.chart(n).has_data() or n in ("step", "memory")]
        cols = max(1, min(3, (width + 1) // (MIN_WIDTH + 1)))
        rows = height // MIN_HEIGHT
        capacity = cols * rows
        if capacity and len(names) > capacity:
            # Leave the last row a line for the "more" hint.
            rows = (height - 1) // MIN_HEIGHT
            capacity = cols * rows
        pages = max(1, -(-len(names) // capacity)) if capacity else 1
        self.page %= pages
        shown = names[self.page * capacity : (self.page + 1) * capacity] if capacity else []
        self.more = len(names) - len(shown)
        self.shown = shown
        for plot in self.query(HistoryPlot):
            was = plot.display
            plot.display = plot.id is not None and plot.id.removeprefix("plot-") in shown
            if (plot.display and not was) or plot.data_key is None:
                self._hand(plot)  # newly shown: it is built now anyway
        used_rows = max(1, -(-len(shown) // cols)) if shown else 1
        self.styles.grid_size_columns = cols
        self.styles.grid_size_rows = used_rows + (1 if self.more else 0)
        self.styles.grid_rows = "1fr " * used_rows + ("1" if self.more else "")
        hint = self.query_one("#plots-more", Static)
        hint.styles.column_span = cols
        if self.more:
            hint.update(Text(f"n: more plots (page {self.page + 1} of {pages})", style="dim"))
        hint.display = bool(self.more)
