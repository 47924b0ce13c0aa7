"""The node table's figures (zeroscope.state.nodes) against a brute-force recomputation from the
raw reports, after every step, and the incremental refold: a report refolds its own node only."""

from __future__ import annotations

import statistics

import msgspec

from tests.fixtures import RunShape, synthetic_run
from zeroscope.agent.schema import Hello, StepReport
from zeroscope.state import ClusterState
from zeroscope.state.viewmodel import node_ranks, node_rows


def brute_force(hellos: dict[int, Hello], newest: dict[int, StepReport]) -> dict:
    """Each node's figures from the Hellos and every rank's newest raw report: no state code.
    Slowness: the rank's compute (step - its wait in collectives) / the median of the other
    ranks' compute in the same step."""
    by_step: dict[int, dict[int, float]] = {}
    for r, rep in newest.items():
        wait = sum(c.exposed_s for c in rep.collectives)
        by_step.setdefault(rep.step, {})[r] = rep.duration_s - wait
    nodes: dict[tuple[int, str], list[int]] = {}
    for r, h in hellos.items():
        nodes.setdefault((h.node_rank, h.hostname), []).append(r)
    out = {}
    for key, ranks in nodes.items():
        reps = [newest[r] for r in ranks if r in newest]
        memories = [
            sum(v or 0 for v in (m.params, m.grads, m.optim, m.activations))
            for m in (rep.memory for rep in reps)
        ]
        shares = [sum(c.exposed_s for c in rep.collectives) / rep.duration_s for rep in reps]
        slowness = {}
        for rep in reps:
            compute = by_step[rep.step]
            others = [c for r, c in compute.items() if r != rep.rank]
            slowness[rep.rank] = compute[rep.rank] / statistics.median(others)
        slowest = max(slowness, key=lambda r: (slowness[r], -r))
        out[key] = {
            "ranks": sorted(ranks),
            "step": min(rep.step for rep in reps),
            "step_time": max(rep.duration_s for rep in reps),
            "memory": (max(memories), min(memories)),
            "exposed": min(shares),
            "slowest": (slowest, slowness[slowest]),
        }
    return out


def test_node_figures_match_a_brute_force_recomputation_after_every_step() -> None:
    run = synthetic_run(RunShape(ranks=40, steps=6, straggler=21, straggle_from=2))
    # Two ranks move: one to another node, one to a node of its own on the same host (network
    # namespaces acting as nodes share a hostname).
    run = [
        msgspec.structs.replace(m, node_rank=1, hostname="node1")
        if isinstance(m, Hello) and m.rank == 3
        else msgspec.structs.replace(m, node_rank=9)
        if isinstance(m, Hello) and m.rank == 39
        else m
        for m in run
    ]
    state = ClusterState()
    hellos: dict[int, Hello] = {}
    newest: dict[int, StepReport] = {}
    checked = 0
    for m in run:
        if isinstance(m, Hello):
            hellos[m.rank] = m
        if isinstance(m, StepReport):
            newest[m.rank] = m
        closed = state.ingest(m)
        if not closed:
            continue
        expected = brute_force(hellos, newest)
        rows = {row.key: row for row in node_rows(state)}
        assert set(rows) == set(expected)
        for key, want in expected.items():
            row = rows[key]
            assert node_ranks(state, key) == want["ranks"]
            assert row.ranks == len(want["ranks"]) == row.reporting
            assert row.step == want["step"]
            assert row.step_time == want["step_time"]
            assert (row.memory_max, row.memory_min) == want["memory"]
            assert abs(row.exposed - want["exposed"]) < 1e-12  # type: ignore[operator]
            assert row.slowest_rank == want["slowest"][0]
            assert abs(row.slowness - want["slowest"][1]) < 1e-9  # type: ignore[operator]
        checked += 1
    assert checked == 6
    rows = {row.key: row for row in node_rows(state)}
    assert rows[(2, "node2")].slowest_rank == 21 and rows[(2, "node2")].slowness_level == "bad"
    assert node_ranks(state, (1, "node1")) == [3, *range(8, 16)]
    # Two nodes share the host node4: the rows say which is which.
    assert {rows[(4, "node4")].name, rows[(9, "node4")].name} == {"node4#4", "node4#9"}
    assert rows[(0, "node0")].name == "node0"


def test_a_report_refolds_only_its_own_node() -> None:
    run = synthetic_run(RunShape(ranks=32, steps=3, collectives=False))
    state = ClusterState()
    state.ingest_all([m for m in run if not (isinstance(m, StepReport) and m.step == 2)])
    before = {row.key: row for row in state.nodes.figures(state.ranks)}
    late = next(m for m in run if isinstance(m, StepReport) and m.step == 2 and m.rank == 17)
    state.ingest(late)
    after = {row.key: row for row in state.nodes.figures(state.ranks)}
    refolded = [key for key in after if after[key] is not before[key]]
    assert refolded == [(2, "node2")]
    assert after[(2, "node2")].step == 1  # its other ranks are still at step 1
    assert before[(2, "node2")].step == 1 and after[(2, "node2")].step_time is not None


def test_flags_are_gathered_per_node() -> None:
    state = ClusterState()
    state.ingest_all(synthetic_run(RunShape(ranks=24, steps=3, collectives=False)))
    rows = {row.key: row for row in node_rows(state, {17: "slow", 9: "mem!", 23: "comm"})}
    assert rows[(2, "node2")].flags == ((17, "slow"), (23, "comm"))
    assert rows[(1, "node1")].flags == ((9, "mem!"),)
    assert rows[(0, "node0")].flags == ()


def test_kept_node_order_and_shared_hosts_follow_ranks_that_move() -> None:
    """NodeBook keeps its sorted nodes and shared hostnames until a node comes or goes; they
    equal a sort and a count over the ranks' newest Hellos after every Hello."""
    hellos = [m for m in synthetic_run(RunShape(ranks=24, steps=1)) if isinstance(m, Hello)]
    moves = [
        msgspec.structs.replace(hellos[3], node_rank=1, hostname="node1"),  # joins another node
        msgspec.structs.replace(hellos[17], node_rank=7),  # a node of its own, same host
        msgspec.structs.replace(hellos[17], node_rank=2),  # ... emptied again
        *(
            msgspec.structs.replace(h, node_rank=0, hostname=hellos[0].hostname)
            for h in hellos[8:16]
        ),
    ]
    state = ClusterState()
    newest: dict[int, Hello] = {}
    for hello in [*hellos, *moves]:
        state.ingest(hello, 0.0)
        newest[hello.rank] = hello
        keys = sorted({(h.node_rank, h.hostname) for h in newest.values()})
        hosts = [host for _, host in keys]
        assert state.nodes.keys() == keys
        assert state.nodes.shared_hosts() == {h for h in hosts if hosts.count(h) > 1}
