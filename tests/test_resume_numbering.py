"""A run resumed from a checkpoint numbers its steps on from the checkpoint's, as the job does.

The agent counted each process's steps from 1, so a run resumed at DeepSpeed's step 21 showed
steps 1, 2, ... beside a log that says 21, 22, ... (a new user's trial: HelloDeepSpeed's BERT
script resumed from a checkpoint). ``Telemetry.number_steps_from`` takes the job's own number
of its next step; the bundled engine calls it from ``load_checkpoint`` (oracle: the engine's
own ``global_steps`` after each step), real DeepSpeed through the attach
(tests/test_attach_resume.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models import TinyGPT, batches
from zeroscope.agent.api import set_telemetry
from zeroscope.agent.schema import Bye, MemoryBytes
from zeroscope.engine.api import initialize


def test_the_job_numbers_its_steps_from_a_resumed_count(agent: Any) -> None:
    tel, sink = agent
    tel.number_steps_from(21)
    for _ in range(2):
        with tel.phase("forward"):
            pass
        tel.step_end(memory=MemoryBytes())
    tel.number_steps_from(5)  # too late: a run's steps never go back
    with tel.phase("forward"):
        pass
    tel.step_end(memory=MemoryBytes())
    assert [r.step for r in sink.reports()] == [21, 22, 23]
    tel.close()
    byes = [m for m in sink.sent if isinstance(m, Bye)]
    assert [b.step for b in byes] == [23]  # the last completed step, by the job's count


def test_a_count_from_zero_or_below_is_ignored(agent: Any) -> None:
    tel, sink = agent
    tel.number_steps_from(0)
    tel.step_end(memory=MemoryBytes())
    assert [r.step for r in sink.reports()] == [1]


@pytest.fixture
def live_agent(agent: Any) -> Iterator[Any]:
    tel, sink = agent
    set_telemetry(tel)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tel, sink
    torch.set_num_threads(threads)
    set_telemetry(None)


def test_the_bundled_engine_numbers_a_resumed_run_by_its_global_steps(
    live_agent: Any, tmp_path: Path
) -> None:
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    }
    tel, sink = live_agent
    set_telemetry(None)  # the first run: saved, not watched
    torch.manual_seed(0)
    first, _, _, _ = initialize(model=TinyGPT(), config=cfg)
    for x, y in batches(3, 2, seed=1):
        first.backward(first(x, y))
        first.step()
    first.save_checkpoint(str(tmp_path))
    set_telemetry(tel)
    torch.manual_seed(0)
    second, _, _, _ = initialize(model=TinyGPT(), config=cfg)
    second.load_checkpoint(str(tmp_path))
    own = []
    for x, y in batches(2, 2, seed=2):
        second.backward(second(x, y))
        second.step()
        own.append(second.global_steps)
    assert own == [4, 5]  # the oracle: the engine's own count
    assert [r.step for r in sink.reports()] == own
