"""What the history plots show, built from zeroscope.state (StepSeries, RankState.history): the
cluster's step time, loss, memory by part, exposed communication, MFU, offload bandwidth and
tokens/s over steps, and one rank's beside the cluster's. Formatting only: every value is a field of a
StepPoint or a StepSummary (state/history.py, state/rank.py), scaled to the axis's unit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from zeroscope.state import units
from zeroscope.state.viewmodel import (
    ClusterState,
    StepPoint,
    StepSeries,
    rank_beside_cluster,
    stacked_parts,
    summary_mfu,
    summary_tokens_per_s,
)

from .history_plot import Chart, Line

PART_COLORS = {"P": "blue", "G": "green", "O": "yellow", "A": "magenta"}
"""The stacked bar's colours (charts.PART_STYLES), in plotext's names."""

ORDER = ("step", "loss", "memory", "exposed", "mfu", "offload", "tokens")
"""Charts in the order they are shown; the first ones stay when space is short."""


def _div(values: Sequence[float | None], div: float) -> list[float | None]:
    return [None if v is None else v / div for v in values]


def _stack(xs: list[int], tops: dict[str, list[float | None]], div: float) -> list[Line]:
    """P at the bottom, then G, O, A stacked on it (each band's top from
    zeroscope.state.history.stacked_parts): fills drawn largest first (A's top, the device
    total) so each part shows as its own band; the legend reads top down."""
    bands = []
    for name in ("P", "G", "O", "A"):
        bands.append(
            Line(
                name,
                xs,
                _div(tops[name], div),
                PART_COLORS[name],
                fill=True,
                marker="█",
                legend="█",
            )
        )
    return bands[::-1]


def cluster_charts(
    series: StepSeries, exposed_max: float, cursor: int | None = None
) -> dict[str, Chart]:
    """The cluster screen's history: one chart per figure, oldest step first."""
    points = list(series.points)
    xs = [p.step for p in points]
    out: dict[str, Chart] = {}

    div, unit = units.axis_unit([p.step_time for p in points], "s")
    stragglers = [p for p in points if p.straggler is not None]
    named = sorted({p.straggler for p in stragglers if p.straggler is not None})
    who = ",".join(f"r{r}" for r in named[:3]) + ("…" if len(named) > 3 else "")
    step = Chart(f"step [{unit}]", cursor=cursor)
    step.lines = [
        Line("slowest", xs, _div([p.step_time for p in points], div), "red"),
        Line("median", xs, _div([p.median_time for p in points], div), "cyan"),
    ]
    if stragglers:
        step.lines.append(
            Line(
                f"straggler {who}",
                [p.step for p in stragglers],
                [p.step_time / div for p in stragglers],
                "yellow",
                marker="x",
                scatter=True,
                legend="x ",
            )
        )
    out["step"] = step

    out["loss"] = Chart(
        "loss",
        [Line("rank mean", xs, [p.loss for p in points], "green")],
        cursor=cursor,
        y_min=None,
        y_format=lambda v: f"{v:.3g}",
        note="NA: no rank reported a loss",
    )

    out["memory"] = _memory_chart(
        "memory, largest rank",
        xs,
        {
            "P": [p.params for p in points],
            "G": [p.grads for p in points],
            "O": [p.optim for p in points],
            "A": [p.activations for p in points],
        },
        [p.host for p in points],
        None,
        cursor,
    )

    exposed = Chart(
        "exposed comm [%]",
        [Line("cluster", xs, _div([p.exposed for p in points], 0.01), "magenta")],
        cursor=cursor,
        hline=exposed_max * 100,
        note="NA: no collectives reported",
    )
    exposed.lines.append(Line(f"alert {exposed_max:.0%}", [], [], "red"))
    out["exposed"] = exposed

    out["offload"] = Chart(
        "offload [GB/s]",
        [Line("median rank", xs, _div([p.offload_bw for p in points], 1e9), "cyan")],
        cursor=cursor,
        note="NA: no offload transfers reported",
    )
    out["mfu"] = _mfu_chart(xs, [("cluster", [p.mfu for p in points], "green")], cursor)
    out["tokens"] = _tokens_chart(
        xs, [("cluster", [p.tokens_per_s for p in points], "green")], cursor
    )
    return out


def _mfu_chart(
    xs: list[int], lines: list[tuple[str, list[float | None], str]], cursor: int | None
) -> Chart:
    """MFU over steps [%] (left out, like offload, when no step has one: the FLOP count off,
    a compiled model, or a trace from before the figure existed)."""
    return Chart(
        "MFU [%]",
        [Line(name, xs, _div(values, 0.01), color) for name, values, color in lines],
        cursor=cursor,
        y_format=lambda v: f"{v:.3g}",
        note="NA: no MFU reported",
    )


def _tokens_chart(
    xs: list[int], lines: list[tuple[str, list[float | None], str]], cursor: int | None
) -> Chart:
    return Chart(
        "tokens/s",
        [Line(name, xs, values, color) for name, values, color in lines],
        cursor=cursor,
        y_format=units.count,
        note="NA: no tokens reported",
    )


def _memory_chart(
    title: str,
    xs: list[int],
    parts: dict[str, list[int | None]],
    host: Sequence[float | None],
    median: Sequence[float | None] | None,
    cursor: int | None,
) -> Chart:
    tops = stacked_parts(parts)
    everything = [*tops["A"], *host, *(median or [])]
    div, unit = units.axis_unit(everything, "B")
    chart = Chart(f"{title} [{unit}]", _stack(xs, tops, div), cursor=cursor)
    if any(host):
        chart.lines.append(Line("host", xs, _div(host, div), "white"))
    if median is not None:
        chart.lines.append(Line("cluster median", xs, _div(median, div), "cyan"))
    return chart


def rank_charts(
    state: ClusterState, rank: int, series: StepSeries, cursor: int | None = None
) -> dict[str, Chart]:
    """One rank's history beside the cluster's (the median rank's; the loss: the ranks' mean),
    over the steps the rank's history keeps."""
    me = f"r{rank}"
    rs = state.ranks.get(rank)
    hist = list(rs.history) if rs else []
    out: dict[str, Chart] = {}

    def pair(
        figure: Callable, cluster: Callable[[StepPoint], float | None]
    ) -> tuple[list[int], list[float | None], list[float | None]]:
        return rank_beside_cluster(state, rank, figure, cluster, series)

    xs, mine, theirs = pair(lambda s: s.duration_s, lambda p: p.median_time)
    div, unit = units.axis_unit([*mine, *theirs], "s")
    out["step"] = Chart(
        f"step [{unit}]",
        [Line(me, xs, _div(mine, div), "yellow"), Line("median", xs, _div(theirs, div), "cyan")],
        cursor=cursor,
    )
    xs, mine, theirs = pair(lambda s: s.loss, lambda p: p.loss)
    out["loss"] = Chart(
        "loss",
        [Line(me, xs, mine, "yellow"), Line("rank mean", xs, theirs, "green")],
        cursor=cursor,
        y_min=None,
        y_format=lambda v: f"{v:.3g}",
        note="NA: this rank reported no loss",
    )
    xs, _, median = pair(lambda s: s.device_total, lambda p: p.median_memory)
    out["memory"] = _memory_chart(
        f"memory of {me}",
        [s.step for s in hist],
        {
            "P": [s.params for s in hist],
            "G": [s.grads for s in hist],
            "O": [s.optim for s in hist],
            "A": [s.activations for s in hist],
        },
        [s.host_bytes for s in hist],
        median,
        cursor,
    )
    xs, mine, theirs = pair(lambda s: s.exposed_share, lambda p: p.median_exposed)
    out["exposed"] = Chart(
        "exposed comm [%]",
        [Line(me, xs, _div(mine, 0.01), "yellow"), Line("median", xs, _div(theirs, 0.01), "cyan")],
        cursor=cursor,
        note="NA: no collectives reported",
    )
    xs, mine, theirs = pair(lambda s: s.offload_bw, lambda p: p.offload_bw)
    out["offload"] = Chart(
        "offload [GB/s]",
        [Line(me, xs, _div(mine, 1e9), "yellow"), Line("median", xs, _div(theirs, 1e9), "cyan")],
        cursor=cursor,
        note="NA: no offload transfers reported",
    )
    xs, mine, theirs = pair(summary_mfu, lambda p: p.mfu)
    out["mfu"] = _mfu_chart(xs, [(me, mine, "yellow"), ("cluster", theirs, "green")], cursor)
    xs, mine, _ = pair(summary_tokens_per_s, lambda p: p.tokens_per_s)
    out["tokens"] = _tokens_chart(xs, [(me, mine, "yellow")], cursor)
    return out
