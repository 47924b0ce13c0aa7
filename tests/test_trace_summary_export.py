"""Tier 1: `zeroscope summary` and `zeroscope export` on a synthetic trace with known numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zeroscope.agent import schema
from zeroscope.agent.schema import (
    Collective,
    Event,
    Hello,
    MemoryBytes,
    Phases,
    StepReport,
    Transfer,
)
from zeroscope.cli import main
from zeroscope.store.trace import TraceWriter


def build(path: Path) -> None:
    w = TraceWriter(path, job_id="synthetic")

    def put(m: schema.Message) -> None:
        w.append(m, schema.encode(m))

    for rank in (0, 1):
        put(
            Hello(schema_version=schema.SCHEMA_VERSION, job_id="synthetic", rank=rank, world_size=2)
        )
    for step in (1, 2):
        for rank in (0, 1):
            put(
                StepReport(
                    rank=rank,
                    step=step,
                    wall_ns=10**9 * step,
                    duration_s=0.1 * (rank + 1),
                    phases=Phases(forward=0.02, backward=0.03),
                    memory=MemoryBytes(
                        params=100 * step, grads=50, optim=400, activations=7 * step
                    ),
                    collectives=[
                        # 1e6 B all-reduce among 2 ranks in 1 ms: busbw = 1e9 * 2 * 1/2 = 1e9 B/s
                        Collective("all_reduce", 10**6, 2, 0.05, 0.001, 0.00025),
                        # 2e6 B all-gather in 1 ms: busbw = 2e9 * 1/2 = 1e9 B/s
                        Collective("all_gather", 2 * 10**6, 2, 0.01, 0.001, 0.00075),
                    ],
                    transfers=[Transfer("d2h", 3 * 10**6, 0.0, 0.001)] if rank == 1 else [],
                    overflow=step == 2,
                )
            )
    put(Event(rank=0, step=2, wall_ns=2 * 10**9, event="overflow", value=1024.0))
    w.close()


def test_summary_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.zst"
    build(path)
    assert main(["summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    r0, r1 = out["ranks"]
    assert (r0["rank"], r0["steps"], r1["steps"]) == (0, 2, 2)
    assert r0["mean_step_s"] == pytest.approx(0.1) and r1["mean_step_s"] == pytest.approx(0.2)
    assert (r0["params_peak"], r0["grads_peak"], r0["optim_peak"], r0["activations_peak"]) == (
        200,
        50,
        400,
        14,
    )
    # Per-step figures over steady steps (step 1 left out): step 2 alone here.
    # Volume: the all-reduce counts twice (2e6) + the all-gather's 2e6.
    assert r0["comm_bytes_per_step"] == 4 * 10**6
    # Exposed %: waited (0.25 + 0.75 ms) / step time (100 ms on r0, 200 ms on r1).
    assert r0["exposed_percent"] == pytest.approx(1.0)
    assert r1["exposed_percent"] == pytest.approx(0.5)
    assert r0["busbw_bytes_s"] == pytest.approx(1e9)
    assert r0["offload_bytes_s"] is None and r1["offload_bytes_s"] == pytest.approx(3e9)
    assert r0["overflows"] == 1
    total = out["total"]
    assert total["steps"] == 2 and total["comm_bytes_per_step"] == 8 * 10**6  # sum over ranks
    # The cluster's time per step is its step ends' period (1 s apart here), so it agrees with
    # steps/s; its exposed share is the least-exposed rank's wait over the slowest rank's step.
    assert total["mean_step_s"] == pytest.approx(1.0) and total["overflows"] == 1
    assert total["exposed_percent"] == pytest.approx(0.5)
    assert out["job_id"] == "synthetic" and out["world_size"] == 2 and out["events"] == 1
    # Step ends 1 s apart; no rank reported samples: NA, never 0.
    assert out["steps_per_s"] == pytest.approx(1.0) and out["samples_per_s"] is None
    assert out["alerts"] == [] and out["total_aggregation"]["comm_bytes_per_step"]

    assert main(["summary", str(path)]) == 0
    table = capsys.readouterr().out
    assert "busbw GB/s" in table and "all" in table and "NA" in table


def test_the_step_range_is_the_steps_reported_not_the_one_a_crash_was_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "crash.zst"
    build(path)  # steps 1 and 2 reported by both ranks
    w = TraceWriter(path, job_id="synthetic")
    # Rank 1 then crashed in step 3: its error and Bye carry the step it was in.
    for m in (
        Event(rank=1, step=3, wall_ns=3 * 10**9, event="error", message="RuntimeError: boom"),
        schema.Bye(rank=1, step=3, wall_ns=3 * 10**9, exit_code=1),
    ):
        w.append(m, schema.encode(m))
    w.close()
    assert main(["summary", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_range"] == [1, 2] and out["total"]["steps"] == 2


def test_export_chrome_is_loadable_trace_event_json(tmp_path: Path) -> None:
    path = tmp_path / "s.zst"
    build(path)
    out = tmp_path / "out.json"
    assert main(["export", str(path), "--format", "chrome", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events if e.get("name") == "process_name"}
    assert names == {(0, "rank 0"), (1, "rank 1")}
    slices = [e for e in events if e["ph"] == "X"]
    assert all(e["dur"] >= 0 and "ts" in e and "tid" in e for e in slices)
    steps = [e for e in slices if e["name"].startswith("step")]
    assert len(steps) == 4
    ar = [e for e in slices if e["name"] == "all_reduce"]
    assert len(ar) == 4 and ar[0]["args"]["busbw_GBps"] == pytest.approx(1.0)
    # Slices on one thread never partially overlap (Chrome/Perfetto require nesting).
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in slices:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack: list[float] = []
        for a, b in spans:
            while stack and stack[-1] <= a + 1e-6:
                stack.pop()
            assert not stack or b <= stack[-1] + 1e-6
            stack.append(b)
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == 4 and counters[0]["args"]["P"] == 100
    assert [e["name"] for e in events if e["ph"] == "i"] == ["overflow"]


def test_export_to_dash_writes_stdout_and_no_file_named_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-o -`` is stdout, as for every Unix tool (it wrote a file named ``-``)."""
    path = tmp_path / "s.zst"
    build(path)
    monkeypatch.chdir(tmp_path)
    assert main(["export", str(path), "-o", "-"]) == 0
    to_file = tmp_path / "file.json"
    assert main(["export", str(path), "-o", str(to_file)]) == 0
    assert not (tmp_path / "-").exists()
    assert json.loads(capsys.readouterr().out) == json.loads(to_file.read_text())


def test_bad_trace_is_a_one_line_cli_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "x.zst"
    bad.write_text("not a trace")
    for verb in ("summary", "export"):
        assert main([verb, str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("zeroscope: error:") and err.count("\n") == 1
