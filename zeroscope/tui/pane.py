"""A focusable, titled pane whose content is drawn for its current width (tab moves between
panes; the focused one is highlighted and scrolled into view)."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.widget import Widget


class Pane(Widget, can_focus=True):
    DEFAULT_CSS = """
    Pane { height: auto; border: round $primary-darken-2; padding: 0 1; }
    Pane:focus { border: round $accent; }
    """

    def __init__(self, title: str, draw: Callable[[int], Text], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = title
        self._draw = draw

    def render(self) -> Text:
        width = self.content_size.width or 76
        return self._draw(width)
