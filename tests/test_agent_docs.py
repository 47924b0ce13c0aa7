"""The plain-PyTorch example in docs/agent-api.md runs on two ranks against a real collector
and produces what the document promises."""

from __future__ import annotations

import os
import re
import runpy
from pathlib import Path
from typing import Any

from tests.distributed import run_ranks
from zeroscope.agent.schema import Bye, Hello, StepReport
from zeroscope.collector.server import Collector, wait_for

ROOT = Path(__file__).resolve().parent.parent


def example_code() -> str:
    text = (ROOT / "docs" / "agent-api.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.S)[0]


def run_example(rank: int, world: int, address: str, path: str) -> None:
    from zeroscope.agent import api

    os.environ[api.COLLECTOR_ENV] = address
    api.set_telemetry(None)
    runpy.run_path(path, run_name="__main__")
    api.telemetry().close()


def test_the_documented_plain_loop_reports_every_step(tmp_path: Path) -> None:
    got: list[Any] = []
    col = Collector()
    col.add_listener(got.append)
    # Written once, before the ranks start: each rank writing it in turn once let rank 0 read
    # the file while rank 1 had just truncated it, run nothing, and leave rank 1 waiting in
    # init_process_group for a peer that had gone (a 120 s hang in one CI run).
    example = tmp_path / "ex.py"
    example.write_text(example_code())
    with col:
        run_ranks(run_example, 2, col.ingest_address, str(example))
        assert wait_for(lambda: sum(isinstance(m, Bye) for m in got) == 2)
    assert sorted(m.rank for m in got if isinstance(m, Hello)) == [0, 1]
    for rank in (0, 1):
        reps = [m for m in got if isinstance(m, StepReport) and m.rank == rank]
        assert [r.step for r in reps] == list(range(1, 21))
        assert all(len(r.collectives) == 4 and r.memory.activations for r in reps)
        assert all(r.phases.data is not None and r.loss is not None for r in reps)
