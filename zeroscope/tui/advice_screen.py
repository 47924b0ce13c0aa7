"""Advice (key ``a``): which ds_config change buys how much memory or time, from what was
measured (zeroscope.state.advice). Each piece of advice shows its price, the measured evidence,
the exact change and the formula; rules that lacked their figures say what was missing."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Footer

from zeroscope.state.viewmodel import price_words

from .base import StateScreen
from .header import ClusterHeader
from .pane import Pane, hanging


def _price(saves_ms: float | None, saves_bytes: float | None) -> str:
    return ", ".join(price_words(saves_ms, saves_bytes)) or "no price"


class AdviceScreen(StateScreen):
    def __init__(self) -> None:
        super().__init__(name="advice")

    def compose(self) -> ComposeResult:
        yield ClusterHeader()
        with VerticalScroll():
            yield Pane(
                "advice, sorted by gain (evidence, change, price)", self._advice, id="advice"
            )
            yield Pane("rules that could not judge", self._missing, id="missing")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#advice", Pane).focus()
        self.refresh_view()

    def refresh_view(self) -> None:
        self.query_one(ClusterHeader).show(self.state, self.zapp.status_text())
        for pane in self.query(Pane):
            pane.refresh(layout=True)

    def _window(self) -> Text:
        """Replay: which steps the advice judged. A replay holds a window of the run around
        its cursor, not the whole run: after a seek to its end the advice judged 64 steps
        (an "overflow storm" of 2 skips in them) where ``zeroscope advise`` judged all 600 (6
        skips: none)."""
        if self.zapp.replay is None:
            return Text()
        done = self.state.complete_steps()
        if not done:
            return Text()
        return Text(
            f"judged on steps {done[0].step}-{done[-1].step}, the replay's window around its "
            "cursor (`zeroscope advise TRACE` judges the whole run)\n\n",
            style="dim",
        )

    def _advice(self, width: int) -> Text:
        advisory = self.zapp.advisory()
        if not advisory.advice:
            text = self._window()
            text.append("no advice yet: no rule found a change worth making", style="dim")
            return text
        text = self._window()
        for i, a in enumerate(advisory.advice, 1):
            if i > 1:
                text.append("\n\n")
            style = "bold red" if a.severity == "error" else "bold"
            hanging(text, f"{i}. ", f"{a.title}  [{a.rule}]", width, style)
            price = f"{_price(a.saves_ms, a.saves_bytes)}  (confidence {a.confidence})"
            lines = [("   ", price, "green")] + [("   • ", e, "") for e in a.evidence]
            lines += [("   change: ", a.change.text, "cyan"), ("   price:  ", a.formula, "dim")]
            for lead, body, line_style in lines:
                text.append("\n")
                hanging(text, lead, body, width, line_style)
        return text

    def _missing(self, width: int) -> Text:
        notes = self.zapp.advisory().not_judged
        if not notes:
            return Text("every rule had the figures it needs", style="dim")
        text = Text()
        for i, note in enumerate(notes):
            if i:
                text.append("\n")
            hanging(text, f"{note.rule}: ", note.missing, width, "dim")
        return text
