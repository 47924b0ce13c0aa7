"""The zeroscope Textual app: one ClusterState, one feed, five screens.

Threading (Textual's rules): the feed is polled in a thread worker (network or SQLite I/O never
on the UI thread); each batch is folded into ClusterState on the UI thread via
``call_from_thread`` (cheap, and the state then needs no lock); redraws are coalesced by a timer
that redraws the top screen only when the state's version moved, so a burst of 1024 reports is
one frame, not 1024.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, ClassVar, Protocol

from textual.app import App, SystemCommand
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.worker import get_current_worker

from zeroscope.remote.job_over import all_ranks_said_bye
from zeroscope.state.viewmodel import (
    Advisory,
    Alert,
    ClusterState,
    StepSeries,
    advise,
    receive_now,
)
from zeroscope.store.gc_pause import catch_up_fold, is_catch_up

from .base import StateScreen
from .cluster_screen import ClusterScreen
from .dialogs import GotoStepScreen, HelpScreen, QuitScreen
from .feed import Batch, LiveFeed, ReplayFeed
from .screens import SCREENS, screen_for

CHUNK = 256
"""Messages folded into ClusterState per UI-thread call (~5 ms at 1024 ranks)."""
GATHER_S = 0.2
"""Live, the feed's worker gathers what arrives for this long (or a CHUNK) before handing it to
the UI thread: each hand-off wakes Textual's event loop, and 8 ranks at 10 steps/s handed over
one step at a time; the view redraws once a second, so a fifth of a second changes no frame."""
ADVICE_EVERY_S = 2.0
"""The Advice screen and the alerts strip's pointer are recomputed at most this often, per
ADVICE_RANKS ranks: the advisor reads every rank (~0.4 s of a loaded core at 16,384 ranks, 20
times a node table's frame), so a 16,384-rank job's advice is judged every 32 s."""
ADVICE_RANKS = 1024
CLOCK_REDRAW_S = 1.0
"""Live, with no new data, the view is redrawn this often (for its silence and age figures)."""
LIVE_REFRESH_S = 1.0
"""Live, the view is redrawn at most this often (htop's default is 1.5 s, nvitop's 2 s): at
0.25 s the view took ~20 % of a core at 8 ranks and 10 steps/s (bench/tui_cpu.py), taken from
training on a small box. Keys are answered at once whatever the pace."""
REPLAY_REFRESH_S = 0.25
"""In replay the cursor moves with the keys and the playback speed: frames follow it."""


class Feed(Protocol):
    live: bool

    def poll(self, timeout: float) -> Batch | None: ...


class JobHandle(Protocol):
    """What the view needs of the job (zeroscope.run.job.Job). Optional, read with getattr:
    ``alerts() -> list[Alert]`` (its failure, shown first) and ``final_code() -> int | None``
    (the job's own exit code once known, which torchrun's may not be)."""

    @property
    def returncode(self) -> int | None: ...


class ZeroscopeApp(App[str]):
    """``run()`` returns "stop", "detach" or "quit" (what to do with a live job)."""

    TITLE = "zeroscope"
    CSS = "Screen { background: $surface; }"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit_app", "quit"),
        Binding("ctrl+c", "interrupt", "stop job", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("1", "show('cluster')", "cluster", show=False),
        Binding("m", "show('memory')", "memory"),
        Binding("c", "show('comm')", "comm"),
        Binding("l", "show('loss_scale')", "scale"),
        Binding("o", "show('log')", "log"),
        Binding("p", "show('pipeline')", "pipeline", show=False),
        Binding("a", "show('advice')", "advice", show=False),
        Binding("escape", "go_back", "back", show=False),
        Binding("space", "pause", "pause", show=False),
        # Replay's step keys win over a focused heatmap's cursor (check_action lets them through
        # to text inputs and to live views).
        Binding("left", "step(-1)", show=False, priority=True),
        Binding("right", "step(1)", show=False, priority=True),
        Binding("left_square_bracket", "speed(-1)", show=False),
        Binding("right_square_bracket", "speed(1)", show=False),
        Binding("g", "goto", "go to step", show=False),
    ]

    def __init__(
        self,
        state: ClusterState,
        feed: Feed | None = None,
        *,
        job: JobHandle | None = None,
        trace: str | None = None,
        refresh_s: float | None = None,
        live_clock: bool | None = None,
    ) -> None:
        super().__init__()
        self.state = state
        self.feed = feed
        self.job = job
        self.trace = trace
        live = bool(feed and feed.live)
        self.refresh_s = refresh_s or (LIVE_REFRESH_S if live else REPLAY_REFRESH_S)
        self.live_clock = live if live_clock is None else live_clock
        """Judge silence against the wall clock (live) or the trace's own clock (replay)."""
        self._drawn = -1
        self._drawn_at = 0.0
        self._advisory: tuple[int, Advisory, float] | None = None
        self._advice_pending = False
        """A big job's first advice is being judged just after the first frame."""
        self.job_over = False
        """Set (mark_over) by a viewer that learns the job is gone (attach's tunnel keeper)."""
        self.run_series: StepSeries | None = None
        """Replay: the whole run's history series (read in the background); None until then."""

    @property
    def replay(self) -> ReplayFeed | None:
        return self.feed if isinstance(self.feed, ReplayFeed) else None

    # -- lifecycle -----------------------------------------------------------------------
    def on_mount(self) -> None:
        self.push_screen(ClusterScreen())
        if self.feed is not None:
            self.run_worker(self._poll_feed, thread=True, exclusive=True, name="feed")
            self.set_interval(self.refresh_s, self._tick)

    def _poll_feed(self) -> None:
        worker = get_current_worker()
        assert self.feed is not None
        while not worker.is_cancelled:
            try:
                batch = self.feed.poll(0.1)
            except Exception as exc:  # a broken trace or socket is shown, never a crash
                self.call_from_thread(self.notify, f"feed stopped: {exc}", severity="error")
                return
            if batch is None:
                continue
            if self.feed.live:
                self._gather(batch)
            # Fold big bursts in slices so keys and paints interleave with a 1024-rank step. A
            # catch-up (a late viewer's snapshot, a seek's rebuild) is folded with the garbage
            # collector held off, and a snapshot frozen after (store/gc_pause.py): the worker
            # holds it across the slices, each handed to the UI thread and waited for.
            messages = batch.messages
            with catch_up_fold(is_catch_up(len(messages)), freeze=batch.snapshot):
                for start in range(0, max(1, len(messages)), CHUNK):
                    if worker.is_cancelled:
                        return
                    part = Batch(
                        messages[start : start + CHUNK],
                        reset=batch.reset and start == 0,
                        final=batch.final and start + CHUNK >= len(messages),
                        overview=batch.overview if start == 0 else None,
                    )
                    self.call_from_thread(self.apply_batch, part)

    def _gather(self, batch: Batch) -> None:
        """Add to a live ``batch`` what arrives within :data:`GATHER_S` (worker thread)."""
        assert self.feed is not None
        deadline = time.monotonic() + GATHER_S
        while len(batch.messages) < CHUNK:
            now = time.monotonic()
            if now >= deadline:
                return
            more = self.feed.poll(deadline - now)
            if more is None:
                return
            batch.messages.extend(more.messages)

    def apply_batch(self, batch: Batch) -> None:
        """Fold a batch in (UI thread)."""
        if batch.reset:
            old = self.state
            self.state = ClusterState(history_steps=old.history_steps, rules=old.rules)
            # What the trace says of itself, not its messages: kept through a seek.
            self.state.job_id = old.job_id
            self.state.thinned, self.state.totals.thinned = old.thinned, old.totals.thinned
            self.state.recording_error = old.recording_error
        now = receive_now() if self.live_clock else None
        self.state.ingest_all(batch.messages, now)
        if isinstance(self.feed, LiveFeed):
            self.feed.applied(len(batch.messages))
        if batch.final:
            self.state.flush()
            self.state.version += 1
        if batch.overview is not None:
            self.run_series = batch.overview
            self.state.version += 1

    def _tick(self) -> None:
        # Redraw when the state moved. Live, with nothing new, once a second only, so "silent
        # for 2 s" appears (every tick redrew the whole screen: 4 frames a second of an idle
        # view is most of what a monitoring view should not cost). An advisory held back by its
        # rate limit is redrawn once due, even if the state has stopped moving (a paused replay,
        # a finished job): advice is never left stale.
        now = time.monotonic()
        clock_due = self.live_clock and now - self._drawn_at >= CLOCK_REDRAW_S
        if self.state.version != self._drawn or clock_due or self._advice_due():
            self.redraw()

    def _advice_due(self) -> bool:
        """The advice was judged on an older state and its rate limit has passed."""
        cached = self._advisory
        return (
            cached is not None
            and cached[0] != self.state.version
            and time.monotonic() - cached[2]
            >= ADVICE_EVERY_S * max(1.0, len(self.state.ranks) / ADVICE_RANKS)
        )

    @property
    def settled(self) -> bool:
        """The screen shows the newest state, advice included (what a snapshot waits for)."""
        cached = self._advisory
        advised = (cached is None and not self._advice_pending) or (
            cached is not None and cached[0] == self.state.version
        )
        return self._drawn == self.state.version and advised

    def redraw(self) -> None:
        self._drawn = self.state.version
        self._drawn_at = time.monotonic()
        if not self.is_running:
            return  # shutting down: the screens' widgets are being removed under the timer
        screen = self.screen
        if isinstance(screen, StateScreen) and screen.is_mounted:  # its on_mount draws it
            screen.refresh_view()

    # -- what screens ask --------------------------------------------------------------------
    def alerts(self) -> list[Alert]:
        alerts = self.state.alerts(receive_now() if self.live_clock else None)
        job_alerts = getattr(self.job, "alerts", None)
        return [*job_alerts(), *alerts] if callable(job_alerts) else alerts

    def advisory(self) -> Advisory:
        """The advisor's conclusions on the state (recomputed when it moved, at most every
        ADVICE_EVERY_S seconds: a live 1024-rank job moves four times a second)."""
        if self._advisory is None or self._advice_due():
            self._advisory = (self.state.version, advise(self.state), time.monotonic())
        return self._advisory[1]

    def advice_pointer(self) -> str | None:
        """The alerts strip's line pointing to the Advice screen (None when there is none).
        A job of more than ADVICE_RANKS ranks has its first advice judged just after the first
        frame is painted, not inside it: the advisor reads every rank (~1 s of a loaded core
        at 16,384 ranks), and a late viewer is to see the cluster first."""
        if self._advisory is None and len(self.state.ranks) > ADVICE_RANKS:
            if not self._advice_pending:
                self._advice_pending = True
                self.call_after_refresh(self._first_advice)
            return None
        advisory = self.advisory()
        top = advisory.headline
        if top is None:
            return None
        more = f" (+{len(advisory.advice) - 1} more)" if len(advisory.advice) > 1 else ""
        return f"advice: {top.title}{more}: press a"

    def _first_advice(self) -> None:
        self.advisory()
        self._advice_pending = False
        self.redraw()

    @property
    def cursor(self) -> int | None:
        """Replay: the step on screen (the plots' cursor); None live."""
        if self.replay is None:
            return None
        latest = self.state.latest()
        return latest.step if latest is not None else None

    @property
    def log_path(self) -> str | None:
        """The job's own output: the live job's log, or the one recorded beside the trace."""
        log = getattr(self.job, "log", None) if self.job is not None else None
        if log:
            return str(log)
        if self.trace:
            from pathlib import Path

            beside = Path(self.trace).with_suffix(".log")
            return str(beside) if beside.is_file() else None
        return None

    def status_text(self) -> str:
        if self.replay is not None:
            r = self.replay
            mode = "⏸ paused" if r.paused else "▶ playing"
            return f"REPLAY {mode} {r.speed:g}x  step {r.position}/{r.last}"
        if self.job is not None and self.job.returncode is not None:
            log = getattr(self.job, "log", None)
            final = getattr(self.job, "final_code", None)
            code = final() if callable(final) else self.job.returncode
            return f"job exited ({code})" + (f", output in {log}" if code and log else "")
        if self.live_clock and (self.job_over or all_ranks_said_bye(self.state)):
            return "ENDED"  # attach: the job finished, what is shown is its last state
        return "LIVE" if self.live_clock else ""

    def mark_over(self) -> None:
        """The job is over (its collector is gone): the view stops saying LIVE."""
        self.job_over = True
        self.redraw()

    def open_rank(self, rank: int) -> None:
        from .rank_screen import RankScreen

        self._pop_to_cluster()
        self.push_screen(RankScreen(rank))

    def _pop_to_cluster(self) -> None:
        while len(self.screen_stack) > 2 and not isinstance(self.screen, ClusterScreen):
            self.pop_screen()

    # -- actions -------------------------------------------------------------------------
    def exit(self, result: str | None = None, *args: Any, **kwargs: Any) -> None:
        """Once asked to exit, the app takes no more keys: a screen pushed while Textual tears
        the app down mounts with no children (a key typed right after ``q`` crashed it)."""
        self._exiting = True
        super().exit(result, *args, **kwargs)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if getattr(self, "_exiting", False):
            return False
        if action in ("step", "pause", "speed", "goto"):
            from textual.widgets import Input

            return self.replay is not None and not isinstance(self.focused, Input)
        return True

    def action_show(self, name: str) -> None:
        if getattr(self.screen, "name", None) == name:
            return
        self._pop_to_cluster()
        if name != "cluster":
            self.push_screen(screen_for(name))

    def action_go_back(self) -> None:
        if (
            len(self.screen_stack) > 2
            and isinstance(self.screen, StateScreen)
            and not isinstance(self.screen, ClusterScreen)
        ):
            self.pop_screen()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(replay=self.replay is not None, rules=self.state.rules))

    def action_quit_app(self) -> None:
        if self.job is not None and self.job.returncode is None:
            self.push_screen(QuitScreen(), callback=self._quit_choice)
        else:
            self.exit("quit")

    def action_interrupt(self) -> None:
        """Ctrl-C: as under torchrun, stop the job (the trace is kept); in replay, quit."""
        self.exit("stop" if self.job is not None and self.job.returncode is None else "quit")

    def _quit_choice(self, choice: str | None) -> None:
        if choice in ("stop", "detach"):
            self.exit(choice)

    def action_pause(self) -> None:
        if self.replay is not None:
            self.replay.toggle_pause()
            self.redraw()

    def action_step(self, delta: int) -> None:
        if self.replay is not None:
            self.replay.step_by(delta)

    def action_speed(self, delta: int) -> None:
        if self.replay is not None:
            self.notify(f"replay speed {self.replay.faster(delta):g}x", timeout=1.5)
            self.redraw()

    def action_goto(self) -> None:
        if self.replay is not None:
            self.push_screen(GotoStepScreen(self.replay.first, self.replay.last), self._goto)

    def _goto(self, step: int | None) -> None:
        if step is not None and self.replay is not None:
            self.replay.goto(step)

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """zeroscope's own commands only: its screens, its ranks, replay's controls, help and
        quit. Textual's generic entries (themes, screenshots, maximize) are left out: they do
        not help read a training job and crowd the list."""
        yield SystemCommand("Help: keys", "every key and what the columns mean", self.action_help)
        yield SystemCommand(
            "Quit", "leave zeroscope (asks while the job runs)", self.action_quit_app
        )
        for name, (title, help_text) in SCREENS.items():
            yield SystemCommand(title, help_text, lambda n=name: self.action_show(n))
        for rank in sorted(self.state.ranks)[:64]:
            yield SystemCommand(
                f"Rank {rank}", f"drill into rank {rank}", lambda r=rank: self.open_rank(r)
            )
        if self.replay is not None:
            yield SystemCommand("Replay: pause / play", "space", self.action_pause)
            yield SystemCommand("Replay: go to step", "g", self.action_goto)
