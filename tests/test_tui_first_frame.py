"""A big job's first frame comes before its first advice: the advisor reads every rank (~1 s
at 16,384 ranks), so the app judges it just after the first frame is painted, then shows the
pointer (a small job's first frame carries it as before: tests/test_tui_advice.py)."""

from __future__ import annotations

import pytest

from tests.test_tui import screen_text, sync
from tests.test_tui_advice import storm_state
from zeroscope.tui import app as app_module
from zeroscope.tui.app import ZeroscopeApp


@sync
async def test_a_big_jobs_first_advice_comes_after_its_first_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app_module, "ADVICE_RANKS", 2)  # the 4-rank storm counts as big
    seen_at_advice: list[str] = []
    real = app_module.advise

    def advise(state):  # type: ignore[no-untyped-def]
        seen_at_advice.append(screen_text(app))
        return real(state)

    monkeypatch.setattr(app_module, "advise", advise)
    app = ZeroscopeApp(storm_state())
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(100):
            await pilot.pause(0.05)
            if app.settled and app._advisory is not None:
                break
        await pilot.pause()
        assert app.settled and "press a" in screen_text(app)
    # When the advisor ran, the cluster was already on screen, without a pointer yet.
    assert len(seen_at_advice) == 1
    assert "r3 " in seen_at_advice[0] and "press a" not in seen_at_advice[0]
