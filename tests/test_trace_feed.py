"""Every reader of a trace folds it the same way (zeroscope.store.feed): on a run where one rank
was refused at the collector's door, ``summary``, ``export`` and ``replay --headless`` name the
same missing rank with the same reason, and their figures agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fixtures import write_trace
from zeroscope.agent import schema
from zeroscope.agent.schema import Admission, Hello, Message, StepReport
from zeroscope.cli import main as cli_main

T0_NS = 1_700_000_000 * 10**9


def _hello(rank: int) -> Hello:
    return Hello(
        schema_version=schema.SCHEMA_VERSION,
        job_id="j",
        rank=rank,
        world_size=3,
        local_rank=rank,
        node_rank=0,
        local_world_size=3,
    )


def _run() -> list[Message]:
    """Ranks 0 and 1 report three steps; rank 2's connection was refused (wrong token)."""
    msgs: list[Message] = [_hello(0), _hello(1)]
    msgs.append(
        Admission(
            wall_ns=T0_NS,
            reason="unauthenticated",
            unit="connection",
            peer="10.0.0.9",
            rank=2,
            node_rank=0,
            world_size=3,
            role="rank",
        )
    )
    for step in (1, 2, 3):
        for rank in (0, 1):
            msgs.append(
                StepReport(rank=rank, step=step, wall_ns=T0_NS + step * 10**8, duration_s=0.1)
            )
    return msgs


def test_summary_export_and_replay_agree_on_a_refused_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.zstrace"
    write_trace(trace, _run())
    assert cli_main(["summary", "--json", str(trace)]) == 0
    summary = json.loads(capsys.readouterr().out)
    [missing] = summary["missing_ranks"]
    # The hand-written answer: the refused rank, with the door's reason (not "unheard").
    assert (missing["rank"], missing["reason"]) == (2, "unauthenticated")
    assert "10.0.0.9" in missing["message"]

    out = tmp_path / "t.json"
    assert cli_main(["export", str(trace), "-o", str(out)]) == 0
    capsys.readouterr()
    figures = json.loads(out.read_text())["otherData"]["figures"]
    assert figures["missing_ranks"] == summary["missing_ranks"]
    assert [r["rank"] for r in figures["ranks"]] == [r["rank"] for r in summary["ranks"]] == [0, 1]

    assert cli_main(["replay", "--headless", str(trace)]) == 0
    replayed = capsys.readouterr().out.splitlines()
    assert f"  missing r2 (node 0): {missing['message']}" in replayed
