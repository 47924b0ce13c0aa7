"""Modal dialogs: help, the quit question (stop the job or leave it running), go to step."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from zeroscope.state.viewmodel import AlertRules

KEYS: list[tuple[str, str]] = [
    ("[b]Keys[/b]", ""),
    ("↑ ↓  j k", "move in the rank table (heatmap: ← → too)"),
    ("enter", "drill into the rank under the cursor"),
    ("escape", "back to the cluster view (or clear the filter)"),
    ("tab", "next pane"),
    ("m  c  l  o", "memory · communication · loss scale · the job's log"),
    ("p", "pipeline screen (stages x time, bubbles; 3D-parallel jobs)"),
    ("a", "advice: which ds_config change buys how much memory or time"),
    ("s", "sort the table (heatmap: metric)"),
    ("v", "table / heatmap"),
    ("b", "one row per node / per rank (a multi-node job)"),
    ("n", "more history plots (when they do not all fit)"),
    ("/", "filter ranks: 3  0-7  r12  node1  slow"),
    ("ctrl+p", "command palette (every screen, every rank)"),
    ("?", "this help        q  quit"),
    ("[b]Columns[/b]", ""),
    (
        "memory",
        "device bytes by part: [bold blue]P[/] params [bold green]G[/] grads "
        "[bold yellow]O[/] optimizer [bold magenta]A[/] activations",
    ),
    ("", "P counts frozen parameters too (LoRA); G and O only the trainable"),
    ("slow", "the rank's compute (step minus time waiting in collectives)"),
    ("", "÷ the median of the other ranks' (1.00x typical)"),
    ("expo", "exposed comm: share of the rank's step spent waiting in collectives"),
    ("offload", "host ↔ device transfer bandwidth; scale: fp16 loss scale"),
    ("flag", "slow · comm · mem! · silent · exited · died · drops (see the alerts)"),
]
REPLAY_KEYS: list[tuple[str, str]] = [
    ("[b]Replay[/b]", ""),
    ("space", "pause / play     ← →   step back / forward"),
    ("[  ]", "slower / faster  g     go to step"),
]
KEY_COLUMN = 14
"""The key column's width: a description that wraps continues under itself, never at column 0."""


def help_table(rows: list[tuple[str, str]]) -> Table:
    """Two columns, the second wrapping with a hanging indent at whatever width the dialog gets
    (an 80-column terminal wrapped the old fixed-width text back to the left edge)."""
    table = Table.grid(padding=(0, 1))
    table.add_column(width=KEY_COLUMN, no_wrap=True)
    table.add_column(ratio=1)
    for key, text in rows:
        if key.startswith("[b]"):
            table.add_row(Text.from_markup(key), Text.from_markup(text, style="dim"))
        else:
            table.add_row(Text(key), Text.from_markup(text))
    return table


def threshold_rows(rules: AlertRules) -> list[tuple[str, str]]:
    """``AlertRules.thresholds()`` lines ("name   rule") as table rows."""
    rows: list[tuple[str, str]] = [("[b]Colours[/b]", "zeroscope.state.AlertRules")]
    for line in rules.thresholds():
        name, _, rule = line.strip().partition(" ")
        rows.append((name if line[:1] != " " else "", (rule if line[:1] != " " else line).strip()))
    return rows


class HelpScreen(ModalScreen[None]):
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; max-width: 100%; height: auto; max-height: 100%;
        padding: 0 1; border: round $primary; background: $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "close")]

    def __init__(self, replay: bool = False, rules: AlertRules | None = None) -> None:
        super().__init__()
        self.replay = replay
        self.rules = rules or AlertRules()

    def compose(self) -> ComposeResult:
        rows = KEYS + threshold_rows(self.rules) + (REPLAY_KEYS if self.replay else [])
        with VerticalScroll() as scroll:
            scroll.border_title = "help (↑ ↓ scroll, escape closes)"
            yield Static(help_table(rows))


class QuitScreen(ModalScreen[str]):
    """Quitting while the job runs: stop it, or leave it running (headless lines follow).
    "Leave running" has the focus: ``q`` then Enter must not stop a training run (the first
    button, Stop, had it), and the arrow keys move between the buttons as a dialog's do."""

    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical { width: 64; height: auto; padding: 1 2; border: thick $warning;
        background: $panel; }
    QuitScreen Horizontal { height: auto; margin-top: 1; }
    QuitScreen Button { margin-right: 1; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "choose('stop')", "stop the job"),
        Binding("d", "choose('detach')", "leave it running"),
        Binding("escape,c", "choose('cancel')", "cancel"),
        Binding("left", "app.focus_previous", "previous button", show=False),
        Binding("right", "app.focus_next", "next button", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(
                "The job is still running. Stop it, or leave it running headless "
                "(zeroscope keeps recording and prints a line per step)?"
            )
            with Horizontal():
                yield Button("Stop the job [s]", id="stop", variant="error")
                yield Button("Leave running [d]", id="detach", variant="primary")
                yield Button("Cancel [esc]", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#detach", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)


class GotoStepScreen(ModalScreen[int | None]):
    DEFAULT_CSS = """
    GotoStepScreen { align: center middle; }
    GotoStepScreen > Vertical { width: 40; height: auto; padding: 1 2; border: round $primary;
        background: $panel; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss_none", "cancel")]

    def __init__(self, first: int, last: int) -> None:
        super().__init__()
        self.first, self.last = first, last

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(f"Go to step ({self.first}-{self.last}):")
            yield Input(type="integer", id="step")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            self.dismiss(int(event.value))
        except ValueError:
            self.notify(f"not a step number: {event.value!r}", severity="error")

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
