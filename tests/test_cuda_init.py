"""Which GPU a rank takes and how its process group is bound, checked on the CPU by replacing
torch's CUDA queries at the boundary.

More local ranks than the GPUs they all see (the README's 2-rank ``make demo`` on a 1-GPU box)
stop every rank before any work with one line (``TooFewGpus``): sharing a GPU round-robin made NCCL
refuse with "Duplicate GPU detected" at the first collective. A launcher that narrows each rank's
``CUDA_VISIBLE_DEVICES`` (one GPU per rank) is the case where fewer GPUs than ranks is right.
``init_distributed(dist_backend=...)`` sets the device and binds the group. The mocks below are
the four CUDA queries and ``init_process_group`` itself; each test asserts the calls made.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist

from zeroscope.engine import api
from zeroscope.engine import process_group as comm


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A machine with ``calls["count"]`` GPUs; records set_device and init_process_group."""
    calls: dict[str, Any] = {"count": 1, "set_device": [], "init": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: calls["count"])
    monkeypatch.setattr(torch.cuda, "set_device", calls["set_device"].append)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls["init"].append(kw))
    monkeypatch.setattr(comm, "_warned_narrowed", False)
    for name in (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "CUDA_VISIBLE_DEVICES",
        comm.WORLD1_COLLECTIVES_ENV,
    ):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_more_local_ranks_than_gpus_stop_every_rank_before_any_work(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda["count"] = 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun --nproc-per-node 2
    for local_rank in (0, 1):  # rank 0 stops too, or it would wait for rank 1 in the rendezvous
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        with pytest.raises(comm.TooFewGpus) as stopped:
            comm.pick_device()
        assert str(stopped.value) == (
            "2 ranks on this node but 1 visible GPU(s): launch at most 1 per node "
            "(--nproc-per-node 1), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train every rank "
            "on the CPU with gloo"
        )
        assert "\n" not in str(stopped.value)
    assert cuda["set_device"] == []  # nothing touched a GPU
    # Without LOCAL_WORLD_SIZE (a launcher that sets only LOCAL_RANK) the rank's index decides.
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert comm.pick_device() == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(comm.TooFewGpus):
        comm.pick_device()


def test_as_many_gpus_as_local_ranks_gives_each_its_own(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda["count"] = 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    picked = []
    for local_rank in (0, 1, 2, 3):
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        picked.append(comm.pick_device())
    assert picked == [torch.device("cuda", i) for i in (0, 1, 2, 3)]
    assert cuda["set_device"] == [0, 1, 2, 3]


def test_a_launcher_narrowing_each_rank_to_one_gpu_runs_said_once(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zeroscope.engine")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    for local_rank in (0, 1):
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(local_rank))  # as srun --gpus-per-task=1
        assert comm.pick_device() == torch.device("cuda", 0)
    assert cuda["set_device"] == [0, 0]
    assert [r.getMessage() for r in caplog.records] == [
        "LOCAL_RANK 0 sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=0): using cuda:0, assuming the "
        "launcher gave each rank its own"
    ]


@pytest.mark.gpu
def test_gpu_more_local_ranks_than_gpus_stop_with_one_line() -> None:
    """On a real machine: one rank more than its GPUs exits with one ``TooFewGpus`` line and no
    device touched. The code before this fix took ``LOCAL_RANK % device_count``, so the extra
    rank shared GPU 0, exited 0 here, and NCCL refused later with "Duplicate GPU detected"."""
    import subprocess
    import sys

    count = torch.cuda.device_count()
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(LOCAL_RANK=str(count), LOCAL_WORLD_SIZE=str(count + 1))
    code = "from zeroscope.engine.process_group import pick_device; pick_device()"
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("zeroscope.engine.process_group.TooFewGpus: ")
    assert f"{count + 1} ranks on this node but {count} visible GPU(s)" in last


def test_deepspeed_init_distributed_with_a_backend_sets_the_device_and_binds_the_group(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")  # two ranks, each narrowed to its own GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    api.init_distributed(dist_backend="nccl")
    assert cuda["set_device"] == [0]
    assert cuda["init"] == [{"backend": "nccl", "device_id": torch.device("cuda", 0)}]


def test_engine_init_binds_nccl_to_the_rank_gpu_and_gloo_to_nothing(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "0")
    comm.init_distributed(torch.device("cuda", 3))
    comm.init_distributed(torch.device("cpu"))
    comm.init_distributed(torch.device("cuda", 3), backend="gloo")  # the user's choice
    assert cuda["init"] == [
        {"backend": "nccl", "device_id": torch.device("cuda", 3)},
        {"backend": "gloo"},
        {"backend": "gloo"},
    ]


def test_no_torchrun_environment_means_no_group_unless_world1_collectives_are_forced(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    comm.init_distributed(torch.device("cuda", 0))
    assert cuda["init"] == []
    monkeypatch.setenv(comm.WORLD1_COLLECTIVES_ENV, "1")
    comm.init_distributed(torch.device("cuda", 0))
    (kw,) = cuda["init"]
    assert (kw["backend"], kw["rank"], kw["world_size"], kw["device_id"]) == (
        "nccl",
        0,
        1,
        torch.device("cuda", 0),
    )
    assert isinstance(kw["store"], dist.HashStore)
