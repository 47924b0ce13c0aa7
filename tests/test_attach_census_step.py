"""Steps between two counts of P/G/O say which step their figures were counted on.

The attach counts an engine's tensors on its first steps, then every N-th step, and repeats
the latest count between (agent/attach/session.py): a new user read a repeated figure as that
step's own. Each report now carries ``MemoryBytes.census_step``, the step of the count it
repeats (0 on a counted step), and the rank detail shows it. Oracle: the schedule
``ZEROSCOPE_MEMORY_EVERY=4`` sets (steps 1-3, then 4, 8; agent/cadence.py's rule), an
unmodified DDP job (tests/jobs/torch_parallel_train.py) under ``zeroscope run``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.attach_support import JOBS, job_env, read_trace, run_zeroscope
from zeroscope.agent.schema import MemoryBytes, StepReport
from zeroscope.state import ClusterState
from zeroscope.tui.rank_figures import rank_figures

STEPS = 9


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_repeated_count_names_the_step_it_was_counted_on(tmp_path: Path) -> None:
    env = dict(job_env(), ZEROSCOPE_MEMORY_EVERY="4")
    args = ["--modes", "ddp", "--steps", str(STEPS), "--out", str(tmp_path / "zs")]
    run_zeroscope(JOBS / "torch_parallel_train.py", args, env, tmp_path / "t.zstrace", 600)
    trace = read_trace(tmp_path / "t.zstrace")
    counted = {1, 2, 3, 4, 8}
    expected = [0 if s in counted else max(c for c in counted if c < s) for s in range(1, 10)]
    for rank in range(2):
        steps = trace[rank].steps
        assert [s.step for s in steps] == list(range(1, STEPS + 1))
        assert [s.memory.census_step for s in steps] == expected
        # The repeated figures are the counted step's own.
        by_step = {s.step: s.memory for s in steps}
        for s in steps:
            if s.memory.census_step:
                source = by_step[s.memory.census_step]
                assert (s.memory.params, s.memory.grads, s.memory.optim) == (
                    source.params,
                    source.grads,
                    source.optim,
                )


def test_the_rank_detail_names_the_step_a_repeated_count_is_from() -> None:
    state = ClusterState()
    for step, census in ((4, 0), (5, 4)):
        memory = MemoryBytes(params=1000, grads=1000, optim=2000, census_step=census)
        state.ingest(StepReport(rank=0, step=step, wall_ns=step, duration_s=0.1, memory=memory))
        text = rank_figures(state.ranks[0], 160).plain
        assert ("P/G/O from" in text) == bool(census)
    assert re.search(r"P/G/O from +step 4 ", text), text
