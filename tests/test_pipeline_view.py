"""The pipeline figures of zeroscope/state/pipeline.py against formulas and known timelines, the
``summary --json`` fields, and the Pipeline screen and mesh-grouped cluster view (Pilot).

Synthetic jobs: each rank's measured actions are a 1F1B timeline with known per-stage costs
(laid out here by an independent event loop, not by the code under test), so the measured
bubble of every stage is known exactly.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.fixtures import write_trace
from zeroscope.agent.schema import (
    SCHEMA_VERSION,
    Hello,
    Message,
    ParallelLayout,
    PipelineStep,
    StageAction,
    StepReport,
)
from zeroscope.state import ClusterState
from zeroscope.state.pipeline import UNIT_COST, one_f_one_b_bound, pipeline_view, simulate


def one_f_one_b(p: int, m: int, rank: int) -> list[tuple[int, str, int]]:
    """The textbook 1F1B order of pipeline rank ``rank``: p - 1 - rank warm-up forwards, then
    one forward / one backward, then the remaining backwards."""
    warmup = min(p - 1 - rank, m)
    order = [(rank, "F", i) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        order += [(rank, "F", f), (rank, "B", b)]
        f, b = f + 1, b + 1
    order += [(rank, "B", i) for i in range(b, m)]
    return order


def gpipe(p: int, m: int, rank: int) -> list[tuple[int, str, int]]:
    return [(rank, "F", i) for i in range(m)] + [(rank, "B", i) for i in range(m)]


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 5), (4, 4)])
@pytest.mark.parametrize("order", [one_f_one_b, gpipe])
def test_planned_bubble_of_balanced_stages_is_the_bound(p: int, m: int, order: object) -> None:
    orders = {r: order(p, m, r) for r in range(p)}  # type: ignore[operator]
    timeline = simulate(orders, p, lambda _s, k: UNIT_COST[k])
    assert timeline is not None
    makespan = max(a.end for acts in timeline.values() for a in acts)
    assert makespan == 3 * (m + p - 1)  # (F + B) per slot, m + p - 1 slots
    for acts in timeline.values():
        busy = sum(a.duration for a in acts)
        assert 1 - busy / makespan == pytest.approx(one_f_one_b_bound(p, m))


def test_incomplete_orders_are_refused() -> None:
    orders = {0: one_f_one_b(2, 2, 0), 1: [(1, "F", 0), (1, "B", 0)]}  # stage 1 skips mb 1
    assert simulate(orders, 2, lambda _s, _k: 1.0) is None


def job(costs: list[float], m: int = 4, steps: int = 3, plan: bool = True) -> list[Message]:
    """Hello + StepReports of a pp=len(costs) job whose stage s takes costs[s] seconds per
    forward and per backward; actions laid out by a plain event loop."""
    p = len(costs)
    orders = {r: one_f_one_b(p, m, r) for r in range(p)}
    end: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    acts: dict[int, list[StageAction]] = {r: [] for r in range(p)}
    pending = {r: list(o) for r, o in orders.items()}
    while any(pending.values()):
        for r in range(p):
            while pending[r]:
                s, k, i = pending[r][0]
                need = [(s - 1, "F", i)] if k == "F" and s else []
                if k == "B":
                    need = [(s, "F", i)] + ([(s + 1, "B", i)] if s < p - 1 else [])
                if any(n not in end for n in need):
                    break
                start = max([free[r]] + [end[n] for n in need])
                end[(s, k, i)] = free[r] = start + costs[s]
                acts[r].append(StageAction(k, s, i, start, costs[s]))
                pending[r].pop(0)
    messages: list[Message] = []
    for r in range(p):
        layout = ParallelLayout(
            pp=r,
            pp_size=p,
            schedule="Schedule1F1B",
            microbatches=m,
            num_stages=p,
            stages=[r],
            parts=list(range(p + 1)),
            plan=[f"{s}{k}{i}" for s, k, i in orders[r]] if plan else [],
        )
        messages.append(
            Hello(schema_version=SCHEMA_VERSION, job_id="pp", rank=r, world_size=p, parallel=layout)
        )
    for step in range(1, steps + 1):
        for r in range(p):
            pipe = PipelineStep(step_s=free[r], actions=acts[r], p2p_wait_s=0.001 * r)
            messages.append(
                StepReport(
                    rank=r, step=step, wall_ns=step * 10**9, duration_s=max(free), pipeline=pipe
                )
            )
    return messages


def view_of(messages: list[Message]):  # type: ignore[no-untyped-def]
    state = ClusterState()
    state.ingest_all(messages)
    return pipeline_view(state.ranks.values())


def test_measured_bubbles_of_a_balanced_job_equal_the_plan() -> None:
    view = view_of(job([0.1, 0.1, 0.1, 0.1], m=8))
    assert view is not None and view.plan_source == "pipeline_order"
    assert view.bound == pytest.approx(3 / 11)
    for row in view.rows:
        assert row.compute_s == pytest.approx(1.6)
        assert row.bubble_fraction == pytest.approx(3 / 11)
        assert row.planned_bubble == pytest.approx(3 / 11)
        assert row.predicted_bubble == pytest.approx(3 / 11)


def test_an_unbalanced_job_names_its_slowest_stage_and_explains_the_bubbles() -> None:
    view = view_of(job([0.1, 0.3, 0.1], m=4))
    assert view is not None
    assert view.slowest.pp == 1 and view.imbalance == pytest.approx(0.3 / (0.5 / 3))
    for row in view.rows:
        assert row.bubble_fraction == pytest.approx(row.predicted_bubble)
        assert row.planned_bubble == pytest.approx(one_f_one_b_bound(3, 4))
    fast = view.rows[0]
    assert fast.bubble_fraction is not None and fast.bubble_fraction > 0.5
    # without torch's plan the executed order stands in
    assert view_of(job([0.1, 0.3, 0.1], plan=False)).plan_source == "executed order"


def test_summary_json_gives_each_rank_its_mesh_and_pipeline(tmp_path: Path) -> None:
    from zeroscope.cli import main

    trace = tmp_path / "pp.zstrace"
    write_trace(trace, job([0.1, 0.3], m=4, steps=3))
    out = tmp_path / "summary.json"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(["summary", "--json", str(trace)]) == 0
    out.write_text(buffer.getvalue())
    ranks = json.loads(out.read_text())["ranks"]
    span = 0.1 + 4 * (0.3 + 0.3) + 0.1  # stage 0's last backward waits for stage 1's
    assert [r["mesh"] for r in ranks] == [{"dp": 0, "pp": 0, "tp": 0}, {"dp": 0, "pp": 1, "tp": 0}]
    for r, cost in zip(ranks, (0.1, 0.3)):
        pipe = r["pipeline"]
        assert pipe["stage"] == r["mesh"]["pp"] and pipe["steps"] == 2  # step 1 left out
        assert pipe["compute_s"] == pytest.approx(8 * cost)
        assert pipe["bubble_fraction"] == pytest.approx(1 - 8 * cost / span)
        assert pipe["p2p_wait_s"] == pytest.approx(0.001 * r["mesh"]["pp"])


def test_pipeline_screen_and_mesh_grouped_cluster_view() -> None:
    from zeroscope.tui.app import ZeroscopeApp
    from zeroscope.tui.pipeline_screen import PipelineScreen
    from zeroscope.tui.rank_screen import RankScreen

    def text(app: ZeroscopeApp) -> str:
        return "\n".join(strip.text for strip in app.screen._compositor.render_strips())

    async def run() -> None:
        state = ClusterState()
        state.ingest_all(job([0.1, 0.3, 0.1], m=4))
        app = ZeroscopeApp(state)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            cluster = text(app)
            assert "pp3×dp1×tp1 1F1B m=4" in cluster and "pp dp tp" in cluster
            await pilot.press("p")
            assert isinstance(app.screen, PipelineScreen)
            shown = text(app)
            assert "1F1B  3 ranks, 3 stages, 4 micro-batches" in shown
            assert "1F1B bound 33%" in shown and "▲stage 1" in shown
            assert "slowest stage 1 (rank 1): compute 1.80x the mean" in shown
            await pilot.press("escape")
            await pilot.press("enter")
            assert isinstance(app.screen, RankScreen)
            assert "stage 0/3 · tp 0/1 · dp 0/1" in text(app)

    asyncio.run(run())


def test_live_agent_carries_the_layout_in_hello_and_the_pipeline_in_its_step() -> None:
    from tests.distributed import connected_publisher
    from zeroscope.agent.live import LiveTelemetry
    from zeroscope.agent.schema import ConfigSummary, MemoryBytes, ParamCounts
    from zeroscope.collector.server import Collector, wait_for

    got: list[Message] = []
    col = Collector()
    col.add_listener(got.append)
    layout = ParallelLayout(pp=1, pp_size=2, schedule="Schedule1F1B", microbatches=4)
    step = PipelineStep(step_s=0.5, actions=[StageAction("F", 1, 0, 0.1, 0.2)], p2p_wait_s=0.1)
    with col:
        tel = LiveTelemetry(
            connected_publisher(col.ingest_address), job_id="t", sample_interval=0.2
        )
        tel.layout(layout)  # before hello: the one Hello carries it
        tel.hello(
            config=ConfigSummary(stage=1, precision="fp32", dp_world_size=1),
            params=ParamCounts(total=1, trainable=1),
        )
        assert wait_for(lambda: any(isinstance(m, Hello) for m in got))  # connected
        tel.pipeline(step)
        tel.step_end(memory=MemoryBytes())
        tel.step_end(memory=MemoryBytes())
        assert wait_for(lambda: len([m for m in got if isinstance(m, StepReport)]) == 2)
        tel.layout(ParallelLayout(pp=1, pp_size=2, tp=1, tp_size=2))  # after: sent again
        assert wait_for(lambda: len([m for m in got if isinstance(m, Hello)]) == 2)
        tel.close()
    hellos = [m for m in got if isinstance(m, Hello)]
    assert hellos[0].parallel == layout and hellos[1].parallel.tp_size == 2  # type: ignore[union-attr]
    first, second = [m for m in got if isinstance(m, StepReport)]
    assert first.pipeline == step and second.pipeline is None


def test_the_timeline_tells_forward_from_backward_without_colour() -> None:
    """Each action starts with its kind's letter, then its micro-batch number: a monochrome
    terminal (or a screenshot in a bug report) still shows F from B."""
    from zeroscope.state.pipeline import Act
    from zeroscope.tui.pipeline_screen import timeline

    acts = [Act("F", 0, 0, 0.0, 0.3), Act("F", 0, 1, 0.3, 0.3), Act("B", 0, 0, 0.9, 0.3)]
    assert timeline(acts, 1.2, 12).plain == "F00F11···B00"
