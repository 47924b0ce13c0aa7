"""What the rank table and the node table share: a cursor over sorted rows, the keys that move
it, and the window of rows that fits (only those are drawn: thousands of rows stay cheap)."""

from __future__ import annotations

from typing import Any, ClassVar

from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.widget import Widget


def cursor_bindings(select: str) -> list[BindingType]:
    """Arrows / vi keys / paging move the cursor, Enter drills in (``select`` names what into),
    ``s`` cycles the sort."""
    return [
        Binding("up,k", "move(-1)", "up", show=False),
        Binding("down,j", "move(1)", "down", show=False),
        Binding("pageup", "move(-10)", show=False),
        Binding("pagedown", "move(10)", show=False),
        Binding("home", "move(-1000000)", show=False),
        Binding("end", "move(1000000)", show=False),
        Binding("enter", "select", select),
        Binding("s", "cycle_sort", "sort"),
    ]


class CursorTable(Widget, can_focus=True):
    """A table of ``_shown`` rows (sorted and filtered by the subclass) with a cursor."""

    BINDINGS: ClassVar[list[BindingType]] = cursor_bindings("select")

    cursor: reactive[int] = reactive(0)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: list[Any] = []
        self._offset = 0

    def _keep_cursor(self, index: int | None) -> None:
        """Put the cursor on ``index`` (the row it was on, re-sorted), else keep it in range."""
        if index is not None:
            self.set_reactive(CursorTable.cursor, index)
        self.set_reactive(CursorTable.cursor, max(0, min(self.cursor, len(self._shown) - 1)))
        self.refresh()

    def watch_cursor(self) -> None:
        self.refresh()

    def action_move(self, delta: int) -> None:
        if self._shown:
            self.cursor = max(0, min(len(self._shown) - 1, self.cursor + delta))

    def _window(self, rows_fit: int) -> range:
        """The indices of the rows drawn: the window scrolls just enough to hold the cursor."""
        if self.cursor < self._offset:
            self._offset = self.cursor
        elif self.cursor >= self._offset + rows_fit:
            self._offset = self.cursor - rows_fit + 1
        self._offset = max(0, min(self._offset, max(0, len(self._shown) - rows_fit)))
        return range(self._offset, min(len(self._shown), self._offset + rows_fit))
