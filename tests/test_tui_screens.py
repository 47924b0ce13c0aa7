"""The screen items (legends, help, filter sign, footers at 80 columns, one
sort arrow, the loss-scale axis, the comm ratio; item 9: the Log screen; item 12: the command
palette). Each test failed before its fix."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import msgspec
import pytest

from tests.fixtures import RunShape, synthetic_run
from tests.test_tui import fixture_state, screen_text, sync
from zeroscope.agent.schema import ConfigSummary, ParamCounts, StepReport
from zeroscope.state import ClusterState, units
from zeroscope.state.prediction import paper_differences
from zeroscope.tui.app import ZeroscopeApp
from zeroscope.tui.charts import PART_STYLES, stacked_bar
from zeroscope.tui.dialogs import HelpScreen
from zeroscope.tui.log_screen import LogScreen
from zeroscope.tui.rank_table import RankTable


def _style_at(text: object, index: int) -> str:
    spans = [s for s in text.spans if s.start <= index < s.end]  # type: ignore[attr-defined]
    return str(spans[-1].style) if spans else ""


@sync
async def test_the_bar_column_names_its_parts_in_their_colours() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        rendered = app.screen.query_one(RankTable).render()
        head = rendered.plain.splitlines()[0]
        at = head.index("P/G/O/A")
        for i, part in enumerate("PGOA"):
            assert _style_at(rendered, at + 2 * i) == PART_STYLES[part]


def test_a_small_part_keeps_its_colour_beside_large_activations() -> None:
    # 1 MB each of P, G, O beside 90 MB of activations in 20 cells: each is 0.2 of a cell.
    bar = stacked_bar([("P", 1e6), ("G", 1e6), ("O", 1e6), ("A", 90e6)], 93e6, 20)
    styles = [_style_at(bar, i) for i in range(20)]
    assert [styles.count(PART_STYLES[p]) for p in "PGOA"] == [1, 1, 1, 17]


@sync
async def test_the_heatmap_has_a_colour_legend_per_metric() -> None:
    app = ZeroscopeApp(fixture_state(ranks=256, steps=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        # The rank table's scale (yellow above 1.05x, red above 1.20x), then 1.30x.
        assert "≤1.05x  ██ ≤1.20x  ██ ≤1.30x  ██ >1.30x  ██ NA" in screen_text(app)
        await pilot.press("s", "s")  # slowness -> memory -> exposed
        await pilot.pause()
        assert "≤10%  ██ ≤20%  ██ ≤30%  ██ >30%" in screen_text(app)


@sync
async def test_help_explains_the_columns() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = " ".join(screen_text(app).split())
        assert "slow the rank's compute (step minus time waiting in collectives)" in text
        assert "expo exposed comm: share of the rank's step spent waiting in collectives" in text
        assert "P counts frozen parameters too (LoRA); G and O only the trainable" in text


@sync
async def test_a_filter_is_shown_in_the_header() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "│ 4 ranks │" in screen_text(app)
        await pilot.press("slash", *"0-1", "enter")
        await pilot.pause()
        assert "2 of 4 ranks shown (filter)" in screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
        assert "│ 4 ranks │" in screen_text(app)


async def _footer(app: ZeroscopeApp, pilot: object) -> str:
    """The bottom line, once the Footer has laid its bindings out (it recomposes after the
    screen's focus settles)."""
    for _ in range(40):
        line = screen_text(app).splitlines()[-1]
        if line.strip():
            return line
        await pilot.pause(0.05)  # type: ignore[attr-defined]
    return line


@pytest.mark.parametrize("ranks", [4, 256])  # table, heatmap
@sync
async def test_the_cluster_footer_fits_80_columns(ranks: int) -> None:
    app = ZeroscopeApp(fixture_state(ranks=ranks, steps=4))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        footer = await _footer(app, pilot)
        for key in ("⏎ rank", "s sort" if ranks == 4 else "s metric", "/ filter", "v view",
                    "q quit", "? help", "m memory", "c comm", "l scale", "o log"):  # fmt: skip
            assert key in footer, (key, footer)


@sync
async def test_rank_detail_footer_says_how_to_go_back() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        app.open_rank(2)
        await pilot.pause()
        assert (await _footer(app, pilot)).startswith("esc back")
        await pilot.press("escape")
        assert app.screen.name == "cluster"


@sync
async def test_the_memory_screen_keeps_activations_at_80_columns() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("m")
        await pilot.pause()
        rows = [ln for ln in screen_text(app).splitlines() if re.match(r"│ r\d ", ln)]
        assert len(rows) == 4
        for r, row in enumerate(rows):
            a = app.state.ranks[r].summary.activations  # type: ignore[union-attr]
            assert row.rstrip(" │").endswith(units.size(a)), row


@sync
async def test_sorting_shows_one_arrow() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("s")  # memory
        head = app.screen.query_one(RankTable).render().plain.splitlines()[0]
        assert head.count("▼") + head.count("▲") == 1 and "total▼" in head


@sync
async def test_every_loss_scale_is_labelled_on_the_row_of_its_points() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 30)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        lines = screen_text(app).splitlines()
    used = {math.log2(a.loss_scale) for a in app.state.complete_steps() if a.loss_scale}
    rows = [ln for ln in lines if "┤" in ln or re.match(r"│\s+│", ln)]
    marked = {}
    for ln in rows:
        label = re.search(r"2\^(\d+)┤", ln)
        plot = ln.split("┤", 1)[1] if "┤" in ln else ln.split("│", 2)[2]
        if "•" in plot or "x" in plot:
            assert label, f"points on a row without a label: {ln!r}"
            marked[int(label.group(1))] = True
    assert set(marked) == used  # 2^16 .. 2^12, each on its own labelled row


def test_the_comm_ratio_names_what_the_paper_leaves_out() -> None:
    params = ParamCounts(total=1000, trainable=1000, padded_total=1000)
    accumulation = ConfigSummary(
        stage=2, precision="bf16", dp_world_size=4, gradient_accumulation_steps=4
    )  # type: ignore[arg-type]
    assert paper_differences(accumulation, params) == [
        "gradients are reduce-scattered every micro-batch (4 per step)"
    ]
    reuse = ConfigSummary(stage=3, precision="bf16", dp_world_size=4, max_reuse_distance=2000)  # type: ignore[arg-type]
    assert paper_differences(reuse, params) == [
        "backward reuses 100% of forward's gathers (stage3_max_reuse_distance)"
    ]


@sync
async def test_the_comm_screen_explains_its_ratio() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        text = " ".join(screen_text(app).replace("│", " ").split())
        assert "ratio = measured / predicted (1.00x: the traffic model met exactly)" in text


class _Job:
    returncode: int | None = None

    def __init__(self, log: str) -> None:
        self.log = log


@sync
async def test_the_log_screen_follows_the_jobs_output(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("[rank0]: step 1 loss 4.2\n[rank1]: step 1 loss 4.3\n")
    app = ZeroscopeApp(fixture_state(), job=_Job(str(log)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("o")
        assert isinstance(app.screen, LogScreen)
        for _ in range(40):
            await pilot.pause(0.05)
            if "[rank1]: step 1 loss 4.3" in screen_text(app):
                break
        assert "[rank0]: step 1 loss 4.2" in screen_text(app)
        with log.open("a") as f:
            f.write("[rank0]: step 2 loss 3.9\n[rank0]: half a li")
        for _ in range(40):
            await pilot.pause(0.05)
            if "step 2 loss 3.9" in screen_text(app):
                break
        text = screen_text(app)
        assert "[rank0]: step 2 loss 3.9" in text and "half a li" not in text
        await pilot.press("escape")
        assert app.screen.name == "cluster"
        await pilot.press("q", "d")


@sync
async def test_the_palette_lists_zeroscope_commands_only() -> None:
    app = ZeroscopeApp(fixture_state())
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
    for generic in ("Theme", "Screenshot", "Maximize", "Keys"):
        assert not any(t.startswith(generic) for t in titles), titles
    for ours in ("Help: keys", "Quit", "Cluster view", "Loss scale", "Log", "Rank 3"):
        assert ours in titles, titles


@sync
async def test_a_key_typed_right_after_quit_is_ignored(tmp_path: Path) -> None:
    """`q` then `o` at once (a user typing ahead, or tmux sending a word): the Log screen was
    pushed while Textual tore the app down, mounted without its children and crashed."""
    log = tmp_path / "job.log"
    log.write_text("[rank0]: step 1 loss 4.2\n")
    app = ZeroscopeApp(fixture_state(), job=_Job(str(log)))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.exit("quit")
        for action in ("show('log')", "show('memory')", "help"):
            await app.run_action(action)
        await pilot.pause()
    assert app.return_value == "quit"


@sync
async def test_an_op_seen_only_at_start_keeps_its_figure_said_as_old() -> None:
    """The initial broadcast runs in step 0 only: its row read `broadcast  NA` beside its own
    point on the sparkline. It keeps its busbw, with how many steps ago it was measured."""
    messages = synthetic_run(RunShape(ranks=4, steps=12))
    algbw = []
    for m in messages:
        if isinstance(m, StepReport) and m.step == 0:
            first = m.collectives[0]
            m.collectives.append(msgspec.structs.replace(first, op="broadcast", label="init"))
            algbw.append(first.nbytes / first.duration_s)
    state = ClusterState()
    state.ingest_all(messages)
    state.flush()
    # nccl-tests: a broadcast's busbw is its algbw; the row shows the median rank's
    expected = {units.rate(v) for v in algbw} | {units.rate(statistics.median(algbw))}
    app = ZeroscopeApp(state)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("c")
        await pilot.pause()
        row = next(line for line in screen_text(app).splitlines() if "broadcast" in line)
    assert "NA" not in row and "11 steps ago" in row, row
    assert any(figure in row for figure in expected), (expected, row)


@sync
async def test_the_offload_figure_never_runs_into_the_exposed_one_at_80_columns() -> None:
    """`7%882.62MB/s` at 80 columns: a 10-character rate in a 9-character column. Every rate
    from 1 B/s to 1.5 TB/s fits 8 characters, and the table keeps a space before it."""
    rates = [m * 10**e for e in range(10) for m in (1.0, 2.5, 9.9949, 9.9951, 99.95, 999.95)]
    assert all(len(units.short_rate(r)) <= 8 for r in [*rates, 1.5e12]), max(
        (units.short_rate(r) for r in rates), key=len
    )
    messages = synthetic_run(RunShape(ranks=4, steps=12))
    for m in messages:
        if isinstance(m, StepReport):
            m.transfers = [
                msgspec.structs.replace(t, duration_s=t.nbytes / 882.62e6) for t in m.transfers
            ]
    state = ClusterState()
    state.ingest_all(messages)
    app = ZeroscopeApp(state)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        rows = [line for line in screen_text(app).splitlines() if "883MB/s" in line]
    assert rows and all(re.search(r"\d% +883MB/s", row) for row in rows), rows


def test_a_loss_scale_event_cut_to_the_pane_never_cuts_a_number() -> None:
    """At 80 columns "fp16 gradient overflow at loss scale 524288: step skipped" was cut bare
    to "... at loss scale 5": a wrong scale. It ends in "…" at a word boundary."""
    from zeroscope.tui.loss_scale_screen import _clip

    message = "fp16 gradient overflow at loss scale 524288: step skipped"
    assert _clip(message, 80) == message
    assert _clip(message, 39) == "fp16 gradient overflow at loss scale…"
    assert _clip(message, 45) == "fp16 gradient overflow at loss scale 524288:…"
    for room in range(10, len(message)):
        shown = _clip(message, room)
        assert len(shown) <= room and shown.endswith("…")
        assert "524288" in shown or "5" not in shown.split()[-1]


@pytest.mark.parametrize("top", [3, 8, 16, 40])
def test_every_power_of_two_the_scale_took_has_its_own_row(top: int) -> None:
    """A GradScaler started at 2^40 and backed off to 2^15: with the chart's nine rows for 40
    octaves the points were drawn on the rows of 2^41 and 2^14. Each row of the chart is then
    one octave (or several rows one octave, for a few), so a power of two lands on its row."""
    from zeroscope.tui.loss_scale_screen import loss_scale_chart

    logs: list[float | None] = [float(k) for k in range(top, 14, -1)] or [float(top), 15.0]
    steps = list(range(len(logs)))
    chart, rows = loss_scale_chart(steps, logs, [False] * len(logs), None)
    lo, hi = chart.y_min, chart.y_max
    assert lo is not None and hi is not None and lo <= 15 and hi >= top
    per_octave = (rows - 1) / (hi - lo)
    assert per_octave >= 1 and per_octave == int(per_octave)  # every octave lands on a row
    ticks, labels = chart.y_ticks or ((), ())
    assert len(ticks) <= 9 and all(f"2^{t:.0f}" == lab for t, lab in zip(ticks, labels))
