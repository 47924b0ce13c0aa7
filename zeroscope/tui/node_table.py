"""The node table: one row per node (a job of thousands of ranks is read a node at a time), the
node's ranks, its slowest rank, step, step time, memory max/min, exposed comm and the alerts of
its ranks; Enter drills into the node's ranks. Draws only the rows that fit."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.binding import BindingType
from textual.message import Message
from textual.reactive import reactive

from zeroscope.state import units
from zeroscope.state.viewmodel import NodeKey, NodeRow, NodeView

from .cursor_table import CursorTable, cursor_bindings
from .rank_rows import FLAG_WORDS
from .rank_table import SLOWNESS_STYLES

SORT_KEYS = ("node", "step", "slowness", "memory", "exposed", "alerts")
_SORT_ATTRS = {
    "step": "step_time",
    "slowness": "slowness",
    "memory": "memory_max",
    "exposed": "exposed",
}
_WORD_ORDER = {word: i for i, word in enumerate(FLAG_WORDS.values())}
EXPOSED_STYLES = {"bad": "bold red", "ok": "", "warn": "yellow", "na": ""}


def sort_nodes(view: NodeView, key: str, descending: bool) -> list[NodeKey]:
    """The nodes in table order. By node, or by how many ranks alerts flag, needs no figure
    (only the rows on screen are then made); by a figure, every row is. Missing figures (NA)
    sort last whichever way; ties keep node order."""
    if key == "node":
        return view.keys[::-1] if descending else list(view.keys)
    if key == "alerts":
        return sorted(view.keys, key=lambda k: -len(view.flags.get(k, ())))  # stable: by node
    attr = _SORT_ATTRS[key]
    rows = view.all_rows()
    known = [row for row in rows if getattr(row, attr) is not None]
    missing = [row.key for row in rows if getattr(row, attr) is None]
    known.sort(key=lambda row: getattr(row, attr), reverse=descending)
    return [row.key for row in known] + missing


def alert_text(row: NodeRow) -> str:
    """``2 slow r7`` : how many of its ranks are flagged, and the most telling one."""
    if not row.flags:
        return ""
    rank, word = min(row.flags, key=lambda f: (_WORD_ORDER.get(f[1], len(_WORD_ORDER)), f[0]))
    return f"{len(row.flags)} {word} r{rank}"


class NodeTable(CursorTable):
    DEFAULT_CSS = """
    NodeTable { height: 1fr; min-height: 3; }
    """
    BINDINGS: ClassVar[list[BindingType]] = cursor_bindings("node's ranks")

    sort_key: reactive[str] = reactive("node")
    descending: reactive[bool] = reactive(False)

    class Selected(Message):
        """The user drilled into a node."""

        def __init__(self, key: NodeKey, name: str) -> None:
            super().__init__()
            self.key = key
            self.name = name

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: list[NodeKey] = []
        self._view: NodeView | None = None

    def set_nodes(self, view: NodeView) -> None:
        """The state's nodes; their rows are made when drawn (only those that fit)."""
        current = self.current_key
        self._view = view
        self._reorder(keep=current)

    def _reorder(self, keep: NodeKey | None = None) -> None:
        if self._view is None:
            return
        self._shown = sort_nodes(self._view, self.sort_key, self.descending)
        index = None
        if keep is not None:
            try:
                index = self._shown.index(keep)
            except ValueError:
                index = None
        self._keep_cursor(index)

    @property
    def current_key(self) -> NodeKey | None:
        if 0 <= self.cursor < len(self._shown):
            return self._shown[self.cursor]
        return None

    @property
    def shown_nodes(self) -> list[str]:
        view = self._view
        return [] if view is None else [view.name(key) for key in self._shown]

    def watch_sort_key(self) -> None:
        self._reorder(keep=self.current_key)

    def watch_descending(self) -> None:
        self._reorder(keep=self.current_key)

    def action_select(self) -> None:
        key = self.current_key
        if key is not None and self._view is not None:
            self.post_message(self.Selected(key, self._view.name(key)))

    def action_cycle_sort(self) -> None:
        i = (SORT_KEYS.index(self.sort_key) + 1) % len(SORT_KEYS)
        self.sort_key = SORT_KEYS[i]
        self.descending = self.sort_key not in ("node", "alerts")  # biggest / slowest first

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        name_w = max(8, min(24, width - 70))
        arrow = "▼" if self.descending else "▲"

        def head(label: str, key: str | None, w: int, left: bool = False) -> str:
            text = label + (arrow if key == self.sort_key else "")
            return text.ljust(w) if left else text.rjust(w)

        text = Text(no_wrap=True, overflow="crop")
        text.append(
            head("node", "node", name_w, True)
            + head("ranks", None, 6)
            + head("slowest", "slowness", 14)
            + head("step", None, 7)
            + head("time", "step", 7)
            + head("mem max", "memory", 9)
            + head("min", None, 7)
            + head("expo", "exposed", 6)
            + "  "
            + head("alerts", "alerts", 6, True),
            style="bold",
        )
        window = self._window(max(1, height - 1))
        rows = [] if self._view is None else self._view.rows(self._shown[i] for i in window)
        for i, row in zip(window, rows, strict=True):
            text.append("\n")
            line = Text(no_wrap=True)
            line.append(f"{row.name[: name_w - 1]:<{name_w}}")
            ranks = str(row.ranks) if row.reporting == row.ranks else f"{row.reporting}/{row.ranks}"
            line.append(f"{ranks:>6}")
            slowest = "" if row.slowest_rank is None else f"r{row.slowest_rank}"
            slow = "" if row.slowness is None else f" {row.slowness:.2f}x"
            line.append(f"{slowest + slow:>14}", style=SLOWNESS_STYLES[row.slowness_level])
            step = "NA" if row.step is None else str(row.step)
            line.append(f"{step:>7}{units.seconds(row.step_time):>7}")
            line.append(f"{units.size(row.memory_max):>9}{units.size(row.memory_min):>7}")
            line.append(f"{units.percent(row.exposed):>6}", style=EXPOSED_STYLES[row.exposed_level])
            alerts = alert_text(row)
            line.append(f"  {alerts}", style="bold red" if alerts else "")
            if i == self.cursor:
                line.stylize("reverse" if self.has_focus else "underline")
            text.append_text(line)
        if not self._shown:
            text.append("\nwaiting for ranks…", style="dim")
        return text
