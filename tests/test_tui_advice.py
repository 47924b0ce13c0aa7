"""Pilot tests of the Advice screen (key ``a``) and the alerts strip's pointer to it, on the
deterministic fixture run with an fp16 overflow storm (every other step overflows after the
start-up descent): the advice is bf16, priced at the skipped share of the step."""

from __future__ import annotations

import pytest

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import screen_text, sync
from zeroscope.state import ClusterState
from zeroscope.state.advice import advise
from zeroscope.tui.advice_screen import AdviceScreen
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.cluster_screen import ClusterScreen

STORM = (0, 1, 2, 3, *range(10, 40, 2))


def storm_state() -> ClusterState:
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=4, steps=40, overflow_steps=STORM)))
    state.flush()
    return state


def test_storm_is_advised_bf16() -> None:
    state = storm_state()
    top = advise(state).top
    assert top is not None and top.rule == "fp16"
    assert top.change.ds_config == {"bf16.enabled": True, "fp16.enabled": False}
    # The fixture's first four steps are the start-up descent; of the 36 steps from the first
    # applied one on, 15 overflow (every other one from the 11th step).
    assert top.saves_ms == pytest.approx(15 / 36 * state.totals.mean_step_s * 1e3, rel=1e-9)


@sync
async def test_advice_screen_and_pointer() -> None:
    app = ZeroscopeApp(storm_state())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, ClusterScreen)
        assert "press a" in screen_text(app) and "bf16" in screen_text(app)
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, AdviceScreen)
        text = screen_text(app)
        assert "fp16 overflow storm" in text and "bf16.enabled = true" in text
        assert "skipped for overflow" in text  # the evidence is shown with the advice
        await pilot.press("escape")
        assert isinstance(app.screen, ClusterScreen)


@sync
async def test_advice_held_back_by_its_rate_limit_catches_up_when_the_state_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The advisor runs at most every ADVICE_EVERY_S; advice judged on an early state must
    still be redone once due even if nothing new arrives (a paused replay, a finished job)."""
    monkeypatch.setattr("zeroscope.tui.app.ADVICE_EVERY_S", 3600.0)
    app = ZeroscopeApp(ClusterState(), refresh_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        app.set_interval(app.refresh_s, app._tick)  # no feed: tick as a live app would
        for _ in range(100):
            await pilot.pause(0.05)
            if app._advisory is not None:
                break
        assert "press a" not in screen_text(app)  # judged on the empty state
        app.state = storm_state()  # the whole run lands at once, then nothing more moves
        app.state.version += 1
        for _ in range(100):
            await pilot.pause(0.05)
            if app._drawn == app.state.version:
                break
        assert not app.settled  # drawn, its advice held back by the rate limit
        assert "press a" not in screen_text(app)
        monkeypatch.setattr("zeroscope.tui.app.ADVICE_EVERY_S", 0.0)  # the limit has passed
        for _ in range(100):
            await pilot.pause(0.05)
            if app.settled:
                break
        await pilot.pause(0.1)
        assert app.settled and "press a" in screen_text(app)


@sync
async def test_an_idle_live_view_redraws_once_a_second_not_every_tick(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Live, with nothing new, the view redraws for its clock once a second; a new state is
    drawn at the next tick. The ticks are driven by hand on a driven clock (no race with the
    machine's speed): 40 ticks of 0.25 s with no data are 10 s, so 10 redraws (it was 40)."""
    now = [1000.0]
    monkeypatch.setattr("zeroscope.tui.app.time.monotonic", lambda: now[0])
    app = ZeroscopeApp(ClusterState(), live_clock=True)
    async with app.run_test(size=(120, 40)):
        drawn = []
        monkeypatch.setattr(app, "redraw", lambda: (drawn.append(now[0]), ZeroscopeApp.redraw(app)))
        app.redraw()
        drawn.clear()
        for _ in range(40):
            now[0] += 0.25
            app._tick()
        assert len(drawn) == 10
        app.state.version += 1  # a new step lands
        now[0] += 0.25
        app._tick()
        assert len(drawn) == 11
