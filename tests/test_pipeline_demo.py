"""The demo's ``--pipeline`` variant end to end: ``zeroscope run --headless --record`` of
examples/train_gpt.py as two pipeline stages (ZeRO-2, fp16, 1F1B), then ``summary --json`` of
its trace: each rank's mesh coordinates and pipeline figures, from the engine's own reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_run import ROOT, _zeroscope


@pytest.mark.slow
def test_demo_pipeline_variant_runs_and_its_trace_has_the_pipeline(tmp_path: Path) -> None:
    trace = tmp_path / "pipe.zstrace"
    run = _zeroscope(
        "run",
        "--nproc-per-node",
        "2",
        "--headless",
        "--record",
        str(trace),
        str(ROOT / "examples" / "train_gpt.py"),
        "--pipeline",
        "--steps",
        "4",
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    steps = [line for line in run.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1", "2", "3", "4"]
    summary = _zeroscope("summary", "--json", str(trace), cwd=tmp_path)
    assert summary.returncode == 0, summary.stderr
    ranks = json.loads(summary.stdout)["ranks"]
    assert [r["mesh"] for r in ranks] == [{"dp": 0, "pp": 0, "tp": 0}, {"dp": 0, "pp": 1, "tp": 0}]
    for r in ranks:
        pipe = r["pipeline"]
        assert pipe["stage"] == r["mesh"]["pp"] and pipe["steps"] == 3
        assert pipe["compute_s"] > 0 and pipe["p2p_wait_s"] >= 0
        assert 0 < pipe["bubble_fraction"] < 1
