"""A big job's trace is thinned beyond its recent steps (zeroscope/store/thinning.py): which rows
it keeps, what the file costs, and that every reader says so.

The expected rows come from the documented policy read on its own here (every k-th step, the
first, the steps an Event or a new straggler touched, the last ``recent``), never from the
policy object's own methods.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from zeroscope.agent import schema
from zeroscope.agent.schema import Collective, Event, Hello, MemoryBytes, Phases, StepReport
from zeroscope.cli import main
from zeroscope.store.thinning import ThinningPolicy
from zeroscope.store.trace import TraceReader, TraceWriter

PER_NODE = 8


def hello(rank: int, world: int) -> Hello:
    return Hello(
        schema_version=schema.SCHEMA_VERSION,
        job_id="big",
        rank=rank,
        world_size=world,
        node_rank=rank // PER_NODE,
        local_world_size=PER_NODE,
    )


def report(rank: int, step: int, duration: float = 0.5) -> StepReport:
    return StepReport(
        rank=rank,
        step=step,
        wall_ns=10**9 * step + rank,
        duration_s=duration,
        phases=Phases(forward=0.1, backward=0.2, optimizer=0.05),
        memory=MemoryBytes(params=2**30, grads=2**29, optim=2**32, activations=2**31 + rank),
        collectives=[
            Collective("all_gather", 2**24 + i, 8, 0.01 * i, 2e-3, 1e-3) for i in range(4)
        ],
        samples=4,
    )


def write_job(
    path: Path,
    *,
    ranks: int,
    steps: int,
    policy: ThinningPolicy | None,
    slow: dict[int, int] | None = None,
    events: tuple[int, ...] = (),
) -> dict[int, int]:
    """Record a synthetic job; ``slow`` maps a step to a rank that is 0.3 s slower from then
    on. Returns every step's payload bytes."""
    w = TraceWriter(path, job_id="big", thinning=policy, commit_interval=3600, commit_rows=ranks)
    for rank in range(ranks):
        m = hello(rank, ranks)
        w.append(m, schema.encode(m))
    slow_rank = None
    sizes: dict[int, int] = {}
    for step in range(1, steps + 1):
        slow_rank = (slow or {}).get(step, slow_rank)
        sizes[step] = 0
        for rank in range(ranks):
            m = report(rank, step, 0.8 if rank == slow_rank else 0.5)
            payload = schema.encode(m)
            sizes[step] += len(payload)
            w.append(m, payload)
        if step in events:
            e = Event(rank=3, step=step, wall_ns=10**9 * step, event="overflow", value=1.0)
            w.append(e, schema.encode(e))
    w.close()
    return sizes


def step_rows(path: Path) -> dict[int, tuple[int, int]]:
    """step -> (rows, payload bytes) of the StepReports the file holds."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT step, COUNT(*), SUM(LENGTH(payload)) FROM messages WHERE kind = 'step' "
            "GROUP BY step"
        ).fetchall()
    return {s: (n, b) for s, n, b in rows}


def test_thinned_trace_keeps_what_the_policy_says(tmp_path: Path) -> None:
    ranks, steps, every, recent = 64, 200, 16, 10
    policy = ThinningPolicy(every=every, recent=recent, from_ranks=64)
    path = tmp_path / "t.zstrace"
    sizes = write_job(path, ranks=ranks, steps=steps, policy=policy, slow={77: 5}, events=(120,))
    # Documented policy: full detail for the last 10 steps, step 1, every 16th, the step an
    # Event touched (120) and the step a rank first went over the straggler limit (77).
    expected = {1, 77, 120} | {s for s in range(1, steps + 1) if s % every == 0}
    expected |= set(range(steps - recent + 1, steps + 1))
    kept = step_rows(path)
    assert set(kept) == expected
    assert all(n == ranks for n, _ in kept.values())  # a kept step keeps every rank
    assert sum(b for _, b in kept.values()) == sum(sizes[s] for s in expected)
    with TraceReader(path) as reader:
        assert reader.thinning == (policy, steps - recent + 1)
        assert reader.count("event") == 1  # events are never thinned
        node_rows = reader.node_steps()
        # One row per node per step, thinned or kept.
        assert len(node_rows) == (steps - recent) * (ranks // PER_NODE)
        row = next(r for r in node_rows if r[0] == 100 and r[1] == 0)
        n, s_min, s_mean, s_max, slowest, _wall, memory, exposed, comm, samples = row[2:]
        assert (n, s_min, s_max, slowest) == (8, 0.5, 0.8, 5)
        assert abs(s_mean - (7 * 0.5 + 0.8) / 8) < 1e-12
        assert memory == 2**30 + 2**29 + 2**32 + 2**31 + 7
        assert abs(exposed - 4e-3) < 1e-12
        assert comm == 8 * sum(2**24 + i for i in range(4))
        assert samples == 32


def test_a_node_sum_past_sqlites_integers_is_kept_and_recording_goes_on(tmp_path: Path) -> None:
    """A faulty sender's report: two collectives of 2**63 bytes, each valid msgpack. Its node's
    collective bytes (2**64 and more) do not fit SQLite's INTEGER: before, writing the step's
    node row raised in the commit, which stops a live collector's recording. Now the row keeps
    the sum as a REAL of its size and every later step is written."""
    ranks, steps = 16, 30
    policy = ThinningPolicy(every=4, recent=5, from_ranks=ranks)
    path = tmp_path / "t.zstrace"
    w = TraceWriter(path, job_id="big", thinning=policy, commit_interval=3600, commit_rows=ranks)
    for rank in range(ranks):
        m = hello(rank, ranks)
        w.append(m, schema.encode(m))
    big = Collective("all_gather", 2**63, 8, 0.0, 2e-3, 1e-3)
    for step in range(1, steps + 1):
        for rank in range(ranks):
            m = report(rank, step)
            if (rank, step) == (3, 2):
                m.collectives = [big, big]
            w.append(m, schema.encode(m))
        w.commit()
    w.close()
    assert max(step_rows(path)) == steps
    with TraceReader(path) as reader:
        comm = {(r[0], r[1]): r[-2] for r in reader.node_steps()}
    assert comm[(2, 0)] == float(2**64 + 7 * sum(2**24 + i for i in range(4)))
    assert comm[(2, 1)] == comm[(3, 0)] == 8 * sum(2**24 + i for i in range(4))


def test_small_job_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "t.zstrace"
    write_job(path, ranks=8, steps=60, policy=ThinningPolicy(every=4, recent=5, from_ranks=64))
    assert set(step_rows(path)) == set(range(1, 61))
    with TraceReader(path) as reader:
        assert reader.thinning is None
        assert reader.node_steps() == []


def test_thinned_file_grows_by_the_kept_rows_only(tmp_path: Path) -> None:
    """The file's growth over more steps against the policy's formula: kept reports x the
    bytes a report row costs in an unthinned trace of the same job, plus the node rows."""
    ranks, every, recent = 64, 32, 8
    policy = ThinningPolicy(every=every, recent=recent, from_ranks=64)
    full = tmp_path / "full.zstrace"
    write_job(full, ranks=ranks, steps=64, policy=None)
    per_row = full.stat().st_size / (64 * ranks)
    sizes = {}
    for steps in (320, 640):
        path = tmp_path / f"t{steps}.zstrace"
        write_job(path, ranks=ranks, steps=steps, policy=policy)
        sizes[steps] = path.stat().st_size
    kept_added = 320 // every  # the steps added keep every 32nd; the window only moved
    node_rows_added = 320 * ranks // PER_NODE
    formula = kept_added * ranks * per_row + node_rows_added * 100
    grown = sizes[640] - sizes[320]
    unthinned_growth = 320 * ranks * per_row
    assert grown < 1.5 * formula, (grown, formula)
    assert grown < unthinned_growth / 8, (grown, unthinned_growth)


def test_summary_and_replay_of_a_thinned_trace_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run's pace from a thinned trace: the job ran 1 step per second (its steps end 1 s
    apart on the ranks' clocks) with 64 ranks x 4 samples; counting only the kept steps would
    read 1/16 of that."""
    path = tmp_path / "t.zstrace"
    write_job(path, ranks=64, steps=160, policy=ThinningPolicy(every=16, recent=8, from_ranks=64))
    assert main(["summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["thinned"].startswith("thinned: every 16th step")
    assert "before step 153" in out["thinned"]
    assert out["steps_per_s"] == pytest.approx(1.0)
    assert out["mean_step_s"] == pytest.approx(1.0)
    assert out["samples_per_s"] == pytest.approx(64 * 4)
    assert main(["summary", str(path)]) == 0
    text = capsys.readouterr().out
    assert "thinned: every 16th step" in text and "figures from thinned data" in text
    assert main(["replay", "--headless", str(path)]) == 0
    text = capsys.readouterr().out
    assert "thinned: every 16th step" in text and "figures from thinned data" in text


def test_unthinned_summary_says_nothing_of_thinning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.zstrace"
    write_job(path, ranks=8, steps=20, policy=ThinningPolicy(every=4, recent=2, from_ranks=64))
    assert main(["summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["thinned"] is None
    assert out["steps_per_s"] == pytest.approx(1.0)


def test_the_replays_header_says_the_history_is_thinned(tmp_path: Path) -> None:
    from zeroscope.store.feed import state_of_file
    from zeroscope.tui.header import header_segments

    path = tmp_path / "t.zstrace"
    write_job(path, ranks=64, steps=40, policy=ThinningPolicy(every=8, recent=4, from_ranks=64))
    pieces = [text for text, _ in header_segments(state_of_file(path), "REPLAY")]
    assert pieces[2] == "thinned: every 8th step"
    full = tmp_path / "full.zstrace"
    write_job(full, ranks=8, steps=10, policy=ThinningPolicy(from_ranks=64))
    assert not any("thinned" in t for t, _ in header_segments(state_of_file(full), "REPLAY"))
