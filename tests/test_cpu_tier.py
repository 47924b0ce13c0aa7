"""The CPU tiers hide CUDA, so a machine with a GPU runs them as a CPU-only one does; GPU tests
opt in with the ``gpu`` marker (tests/conftest.py, tests/distributed.py).

Without the hiding, the engine's ``pick_device`` takes CUDA whenever it is available and the
spawned ranks carry ``LOCAL_RANK``: on a GPU machine the gloo tiers would run on NCCL, two ranks
to one GPU, and fail. The CPU checks below look at what a rank and a child process see; the GPU
ones, on a machine with CUDA, that a CPU-tier rank still picks the CPU and an opted-in one a GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tests.distributed import run_ranks


def _seen(rank: int, world: int) -> tuple[str | None, bool, str]:
    from zeroscope.engine.process_group import pick_device

    return os.environ.get("CUDA_VISIBLE_DEVICES"), torch.cuda.is_available(), str(pick_device())


def test_a_cpu_test_and_everything_it_starts_see_no_gpu() -> None:
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert torch.cuda.is_available() is False
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.stdout.strip() == "''"


def test_cpu_tier_ranks_are_handed_an_empty_device_list_whatever_this_process_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Even were this process's own setting different, a CPU-tier rank gets "".
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert run_ranks(_seen, 2) == [("", False, "cpu")] * 2


@pytest.mark.gpu
def test_gpu_cpu_tier_ranks_pick_the_cpu_and_gpu_ranks_a_gpu() -> None:
    """Before, ranks inherited the machine's GPUs: ``pick_device`` returned ``cuda:0`` in a
    gloo-tier rank, and ``run_ranks`` had no way to opt in."""
    assert torch.cuda.is_available()  # not hidden: the marker opts in
    assert run_ranks(_seen, 1) == [("", False, "cpu")]
    ((_, available, device),) = run_ranks(_seen, 1, gpu=True)
    assert available and device == "cuda:0"
