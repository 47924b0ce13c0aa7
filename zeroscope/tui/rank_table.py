"""The sortable rank table: a stacked P/G/O/A bar, step time, slowness vs the median, exposed
comm, offload bandwidth, loss scale, and MFU (tokens/s beside it from 100 columns) once some
rank reports its work. Draws only the rows that fit (1024 ranks stay cheap)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.message import Message
from textual.reactive import reactive

from zeroscope.state import units
from zeroscope.state.viewmodel import RankRow

from .charts import PART_STYLES, stacked_bar
from .cursor_table import CursorTable, cursor_bindings
from .rank_rows import SORT_KEYS, filtered, sort_rows

SLOWNESS_STYLES = {"bad": "bold red", "warn": "yellow", "ok": "", "na": ""}
"""Colour of a rank's slowness by its level (AlertRules.slowness_level)."""


class RankTable(CursorTable):
    DEFAULT_CSS = """
    RankTable { height: 1fr; min-height: 3; }
    """
    BINDINGS: ClassVar[list[BindingType]] = cursor_bindings("rank")

    sort_key: reactive[str] = reactive("rank")
    descending: reactive[bool] = reactive(False)
    filter_text: reactive[str] = reactive("")

    class Selected(Message):
        """The user drilled into a rank."""

        def __init__(self, rank: int) -> None:
            super().__init__()
            self.rank = rank

    class Resized(Message):
        """The table's (or heatmap's) slot changed size: the screen re-decides which fits."""

    def on_resize(self) -> None:
        self.post_message(self.Resized())

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._rows: list[RankRow] = []
        self._shown: list[RankRow] = []

    # -- data ----------------------------------------------------------------------------
    def set_rows(self, rows: list[RankRow]) -> None:
        """New figures; the table is repainted only when a row changed (the live view redraws
        every second, and a job between steps, or stopped, changes none)."""
        if rows == self._rows:
            return
        current = self.current_rank
        self._rows = rows
        self._reorder(keep=current)

    def _reorder(self, keep: int | None = None) -> None:
        shown = filtered(self._rows, self.filter_text)
        self._shown = sort_rows(shown, self.sort_key, self.descending)
        ranks = [row.rank for row in self._shown]
        self._keep_cursor(ranks.index(keep) if keep in ranks else None)

    @property
    def current_rank(self) -> int | None:
        if 0 <= self.cursor < len(self._shown):
            return self._shown[self.cursor].rank
        return None

    @property
    def shown_ranks(self) -> list[int]:
        return [r.rank for r in self._shown]

    def watch_sort_key(self) -> None:
        self._reorder(keep=self.current_rank)

    def watch_descending(self) -> None:
        self._reorder(keep=self.current_rank)

    def watch_filter_text(self) -> None:
        self.cursor = 0
        self._reorder()

    # -- actions -------------------------------------------------------------------------
    def action_select(self) -> None:
        rank = self.current_rank
        if rank is not None:
            self.post_message(self.Selected(rank))

    def action_cycle_sort(self) -> None:
        keys = SORT_KEYS if any(r.mesh for r in self._rows) else SORT_KEYS[:-1]
        i = (keys.index(self.sort_key) + 1) % len(keys) if self.sort_key in keys else 0
        self.sort_key = keys[i]
        self.descending = self.sort_key not in ("rank", "mesh")  # biggest / slowest first

    # -- drawing -------------------------------------------------------------------------
    def _layout(self, width: int) -> tuple[int, bool, bool, bool]:
        """(bar width, host shown, MFU shown, tokens/s shown). MFU (8 columns) is shown once a
        rank reports its work (the bar gives way: 16 columns left at 80), tokens/s (7) from
        100 columns; a job that reports no work keeps the table as it was."""
        fixed = 6 + 7 + 7 + 6 + 5 + 9 + 7 + 7
        host = width >= 120
        mfu = any(r.throughput is not None for r in self._rows)
        tokens = mfu and width >= 100
        mesh = 10 if any(r.mesh is not None for r in self._rows) else 0
        extra = (8 if mfu else 0) + (7 if tokens else 0)
        bar = max(8, min(48, width - fixed - mesh - extra - (10 if host else 0) - 2))
        return bar, host, mfu, tokens

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        bar, host, mfu, tokens = self._layout(width)
        arrow = "▼" if self.descending else "▲"

        def head(name: str, key: str, w: int, left: bool = False) -> str:
            label = name + (arrow if self.sort_key == key else "")
            return label.ljust(w) if left else label.rjust(w)

        mesh = any(r.mesh is not None for r in self._rows)
        text = Text(no_wrap=True, overflow="crop")
        text.append(
            head("rank", "rank", 6, True)
            + (head("pp dp tp", "mesh", 10, True) if mesh else "")
            + (" host     " if host else ""),
            style="bold",
        )
        # The bar's column names its parts in their colours: the legend of the stacked bar.
        text.append(" memory ", style="bold")
        for i, part in enumerate("PGOA"):
            text.append(("/" if i else "") + part, style=PART_STYLES[part])
        text.append(" " * max(0, bar + 1 - len(" memory P/G/O/A")))
        text.append(
            head("total", "memory", 7)
            + head("step", "step", 7)
            + head("slow", "slowness", 6)
            + head("expo", "exposed", 5)
            + head("offload", "offload", 9)
            + "  scale"
            + ("     MFU" if mfu else "")
            + ("  tok/s" if tokens else "")
            + "  flag",
            style="bold",
        )
        scale = max((r.total or 0 for r in self._rows), default=0)
        cursor = self.cursor
        for i in self._window(max(1, height - 1)):
            row = self._shown[i]
            text.append("\n")
            line = Text(no_wrap=True)
            line.append(f"r{row.rank:<5}")
            if mesh:
                pp, dp, tp = row.mesh or (0, 0, 0)
                group = "bold" if pp % 2 == 0 else "cyan"  # alternate stages stand apart
                line.append(f"{pp:>2} {dp:>2} {tp:>2}   ", style=group)
            if host:
                line.append(f"{row.host[:9]:<10}")
            line.append(" ")
            parts = [("P", row.params), ("G", row.grads), ("O", row.optim), ("A", row.activations)]
            line.append_text(
                stacked_bar(parts, scale, bar) if row.total is not None else Text("NA".ljust(bar))
            )
            slow = row.slowness
            slow_style = SLOWNESS_STYLES[row.slowness_level]
            line.append(f"{units.size(row.total):>7}{units.seconds(row.step_time):>7}")
            line.append(f"{'NA' if slow is None else f'{slow:.2f}x':>6}", style=slow_style)
            line.append(f"{units.percent(row.exposed):>5}{units.short_rate(row.offload_bw):>9}")
            line.append(f" {units.scale_short(row.loss_scale):>6}")
            t = row.throughput
            if mfu:
                line.append(f" {units.fine_percent(t.mfu if t else None):>7}")
            if tokens:
                line.append(f"{units.count(t.tokens_per_s if t else None):>7}")
            line.append(f"  {row.flag}", style="bold red" if row.flag else "")
            if i == cursor:
                line.stylize("reverse" if self.has_focus else "underline")
            text.append_text(line)
        if not self._shown:
            text.append(
                "\n" + ("no rank matches the filter" if self._rows else "waiting for ranks…"),
                style="dim",
            )
        return text
