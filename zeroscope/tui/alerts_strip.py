"""The alerts strip: one line per standing alert, critical first; "no alerts" when quiet."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from zeroscope.state.viewmodel import Alert

from .pane import hanging


def alerts_text(
    alerts: list[Alert], limit: int = 3, pointer: str | None = None, width: int = 0
) -> Text:
    """The strip's text; ``pointer`` (a line naming the top advice) goes last. With a ``width``
    a long alert continues under its own text, not at column 0."""
    if not alerts:
        text = Text(" ✓ no alerts", style="green")
        if pointer:
            text.append(f"   ➜ {pointer}", style="cyan")
        return text
    ordered = sorted(alerts, key=lambda a: a.severity != "critical")
    text = Text()
    for i, alert in enumerate(ordered[:limit]):
        if i:
            text.append("\n")
        style = "bold red" if alert.severity == "critical" else "bold yellow"
        lead = " ▲ " if alert.severity == "critical" else " ! "
        if width:
            hanging(text, lead, alert.message, width, lead_style=style)
        else:
            text.append(lead, style=style)
            text.append(alert.message)
    if len(ordered) > limit:
        text.append(f"  (+{len(ordered) - limit} more)", style="dim")
    if pointer and width:
        text.append("\n")
        hanging(text, " ➜ ", pointer, width, "cyan")
    elif pointer:
        text.append(f"\n ➜ {pointer}", style="cyan")
    return text


class AlertsStrip(Static):
    DEFAULT_CSS = """
    AlertsStrip { height: auto; max-height: 5; border-top: solid $primary-darken-2; }
    """

    _shown: Text | None = None

    def show(self, alerts: list[Alert]) -> None:
        pointer = getattr(self.app, "advice_pointer", None)
        width = self.content_size.width or self.app.size.width
        text = alerts_text(alerts, pointer=pointer() if callable(pointer) else None, width=width)
        if text != self._shown:  # an update reflows the whole screen: only when it changed
            self._shown = text
            self.update(text)
