"""The alerts strip: one line per standing alert, critical first; "no alerts" when quiet."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from zeroscope.state.viewmodel import Alert


def alerts_text(alerts: list[Alert], limit: int = 3, pointer: str | None = None) -> Text:
    """The strip's text; ``pointer`` (a line naming the top advice) goes last."""
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
        text.append(" ▲ " if alert.severity == "critical" else " ! ", style=style)
        text.append(alert.message)
    if len(ordered) > limit:
        text.append(f"  (+{len(ordered) - limit} more)", style="dim")
    if pointer:
        text.append(f"\n ➜ {pointer}", style="cyan")
    return text


class AlertsStrip(Static):
    DEFAULT_CSS = """
    AlertsStrip { height: auto; max-height: 5; border-top: solid $primary-darken-2; }
    """

    def show(self, alerts: list[Alert]) -> None:
        pointer = getattr(self.app, "advice_pointer", None)
        self.update(alerts_text(alerts, pointer=pointer() if callable(pointer) else None))
