"""A focusable, titled pane whose content is drawn for its current width (tab moves between
panes; the focused one is highlighted and scrolled into view)."""

from __future__ import annotations

import textwrap
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


def hanging(
    text: Text, lead: str, body: str, width: int, style: str = "", lead_style: str | None = None
) -> None:
    """Append ``lead + body`` wrapped to ``width`` with its continuation lines indented under
    the body, not back at column 0 (how an 80-column terminal showed long advice and alerts).
    ``lead_style`` styles the lead apart from the body."""
    wrapped = "\n".join(
        textwrap.wrap(
            body,
            width=max(width, len(lead) + 10),
            initial_indent=lead,
            subsequent_indent=" " * len(lead),
            break_on_hyphens=False,
        )
        or [lead]
    )
    if lead_style is None:
        text.append(wrapped, style=style)
    else:
        text.append(wrapped[: len(lead)], style=lead_style)
        text.append(wrapped[len(lead) :], style=style)
