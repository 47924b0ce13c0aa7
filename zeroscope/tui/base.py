"""What every zeroscope screen shares: the header, the footer and a ``refresh_view`` hook the app
calls when ClusterState moved (only for the screen on top)."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.screen import Screen

if TYPE_CHECKING:
    from zeroscope.state.viewmodel import ClusterState

    from .app import ZeroscopeApp


class StateScreen(Screen):
    """A screen drawn from ClusterState."""

    @property
    def zapp(self) -> ZeroscopeApp:
        from .app import ZeroscopeApp

        return cast(ZeroscopeApp, self.app) if isinstance(self.app, ZeroscopeApp) else self.app  # type: ignore[return-value]

    @property
    def state(self) -> ClusterState:
        return self.zapp.state

    def on_screen_resume(self) -> None:
        self.refresh_view()

    def refresh_view(self) -> None:
        """Redraw from the state (override)."""
