"""At 80x24 a line too long for the terminal continues under its own text: the help overlay,
the advice screen and the alerts strip wrapped back to column 0, where a continuation reads as
a new key, a new piece of advice or a new alert. Each test failed on the old layout."""

from __future__ import annotations

import re

from tests.test_tui import fixture_state, screen_text, sync
from tests.test_tui_advice import storm_state
from zeroscope.state.viewmodel import Alert, AlertRules
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.dialogs import KEY_COLUMN, KEYS, REPLAY_KEYS, HelpScreen, threshold_rows

BOXED = re.compile(r"^\s*│ (.*?)\s*│\s*$")


def _boxed(text: str) -> list[str]:
    """The lines inside a bordered box, without the border and its padding column."""
    return [m.group(1) for line in text.splitlines() if (m := BOXED.match(line))]


@sync
async def test_help_wraps_each_description_under_itself_and_scrolls_to_its_end() -> None:
    app = ZeroscopeApp(fixture_state())
    rows = KEYS + REPLAY_KEYS + threshold_rows(AlertRules())
    heads = {re.sub(r"\[/?b\]", "", key) for key, _ in rows}  # "" included: continuations
    seen: list[str] = []
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        for _ in range(4):
            await pilot.pause()
            seen += _boxed(screen_text(app))
            await pilot.press("pagedown")
    assert seen, "no help box on the screen"
    for line in seen:
        # a row starts with its key or a heading; a continuation leaves the key column blank
        assert line[:KEY_COLUMN].strip() in heads, line
    joined = " ".join(" ".join(seen).split())
    assert "bubble > 1F1B bound" in joined  # the last row is reachable by scrolling


@sync
async def test_advice_lines_continue_under_their_text_at_80_columns() -> None:
    app = ZeroscopeApp(storm_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("a")
        await pilot.pause()
        lines = _boxed(screen_text(app))
    advice = [line for line in lines if line.strip()]
    assert any(line.startswith("1. ") for line in advice), advice
    long = [line for line in advice if len(line) > 60]
    assert long, "nothing long enough to wrap at 80 columns"
    for line in advice:
        assert line[:1] == " " or re.match(r"\d+\. ", line) or ":" in line[:24], line


@sync
async def test_an_alert_too_long_for_the_strip_continues_under_its_text() -> None:
    words = "rank 3 has been slower than the median of the other ranks for the last five steps"
    long = Alert("straggler", "critical", f"{words}; {words}", ranks=(3,))
    app = ZeroscopeApp(fixture_state())
    app.alerts = lambda: [long]  # type: ignore[method-assign]
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(1.0)
        rows = screen_text(app).splitlines()
    top = next(i for i, row in enumerate(rows) if row.startswith(" ▲ "))
    strip = rows[top : top + 3]
    assert "rank 3 has been slower" in strip[0] and strip[2].strip() == "five steps", strip
    for row in strip[1:]:
        assert row.startswith("   ") and row.strip(), strip
