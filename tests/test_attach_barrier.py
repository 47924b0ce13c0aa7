"""A barrier is a collective: the time a rank waits in it is waiting, not compute. And gather /
scatter, whose tensors on a rank hold its share only, count the whole size on every rank.

A script whose ranks meet at ``dist.barrier()`` every step, one of them computing longer first
(tests/jobs/barrier_train.py: an injected sleep, the independent answer): the others wait in
the barrier. Unrecorded, that wait passed for their compute, every rank's compute read alike,
and the straggler went unnamed (or another rank was). Recorded, the waiting ranks' barrier
holds the sleep as exposed wait and the judgement names the sleeping rank.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from tests.attach_support import JOBS, RankTrace, job_env, read_trace, run_zeroscope
from zeroscope.state import ClusterState
from zeroscope.state.bandwidth import bus_factor

SLEEP_S = 0.2
STEPS = 6
SLOW = 1


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[int, RankTrace], Path]:
    tmp_path = tmp_path_factory.mktemp("barrier")
    args = ["--steps", str(STEPS), "--slow-rank", str(SLOW), "--sleep-ms", str(SLEEP_S * 1e3)]
    args += ["--out", str(tmp_path / "zs")]
    run_zeroscope(JOBS / "barrier_train.py", args, job_env(), tmp_path / "t.zstrace", 300)
    return read_trace(tmp_path / "t.zstrace"), tmp_path / "zs"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_ranks_waiting_at_a_barrier_wait_and_the_straggler_is_named(
    run: tuple[dict[int, RankTrace], Path],
) -> None:
    trace, out = run
    state = ClusterState()
    waits: dict[int, list[float]] = {0: [], 1: []}
    for rank in (0, 1):
        steps = trace[rank].steps
        assert len(json.loads(Path(f"{out}.{rank}").read_text())["losses"]) == STEPS
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        for report in steps:
            barriers = [c for c in report.collectives if c.op == "barrier"]
            assert [(c.nbytes, c.group_size, c.clock) for c in barriers] == [(0, 2, "host")]
            assert barriers[0].exposed_measured
            waits[rank].append(barriers[0].exposed_s)
    for rank in (0, 1):
        state.ingest(trace[rank].hellos[-1])
    for rank_steps in zip(trace[0].steps, trace[1].steps, strict=True):
        for report in rank_steps:
            state.ingest(report)
    state.flush()
    # The rank that did not sleep waited the sleep out in the barrier; the sleeper did not.
    assert statistics.median(waits[1 - SLOW][1:]) > 0.5 * SLEEP_S
    assert statistics.median(waits[SLOW][1:]) < 0.5 * SLEEP_S
    # So its compute is the step less that wait, and the sleeper is the straggler.
    judged = [a for a in state.complete_steps() if a.step > 1]
    assert all(a.slowest_rank == SLOW for a in judged)
    assert statistics.median(a.slowest_excess or 0.0 for a in judged) > 0.5 * SLEEP_S
    summary = state.ranks[1 - SLOW].summary
    assert summary is not None
    assert summary.ops["barrier"].busbw is None  # it moved no bytes: no rate to show


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gather_and_scatter_count_the_whole_size_on_every_rank(
    run: tuple[dict[int, RankTrace], Path],
) -> None:
    """nccl-tests' S for gather / scatter is the whole gathered (scattered) size: each rank's
    share (written by the job) times the group, the same on the root, whose list holds every
    share, and on the other rank, whose tensors hold its own only."""
    trace, out = run
    for rank in (0, 1):
        shares = json.loads(Path(f"{out}.{rank}").read_text())["shares"]
        for report in trace[rank].steps:
            got = {c.op: (c.nbytes, c.group_size, c.clock) for c in report.collectives}
            for op in ("gather", "scatter"):
                assert got[op] == (2 * shares[op], 2, "host"), (rank, report.step, op)
    assert bus_factor("gather", 2) == bus_factor("scatter", 2) == 0.5
