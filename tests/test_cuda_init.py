"""Which GPU a rank takes and how its process group is bound, checked on the CPU by replacing
torch's CUDA queries at the boundary.

Before the fix ``torch.cuda.set_device(LOCAL_RANK)`` failed with "invalid device ordinal" when a
machine had fewer visible GPUs than local ranks (the README's 2-rank ``make demo`` on a 1-GPU
box, or a launcher that exposes one GPU per rank), ``init_distributed(dist_backend=...)`` never
set the device, and ``init_process_group`` got no ``device_id``. The mocks below are the four
CUDA queries and ``init_process_group`` itself; each test asserts the calls made.
"""

from __future__ import annotations

import logging
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
    monkeypatch.setattr(comm, "_warned_shared_gpu", False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", comm.WORLD1_COLLECTIVES_ENV):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_more_local_ranks_than_gpus_share_them_round_robin_said_once(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cuda["count"] = 2
    caplog.set_level(logging.WARNING, logger="zeroscope.engine")
    picked = []
    for local_rank in (0, 1, 2, 3):
        monkeypatch.setenv("LOCAL_RANK", str(local_rank))
        picked.append(comm.pick_device())
    assert picked == [torch.device("cuda", i) for i in (0, 1, 0, 1)]
    assert cuda["set_device"] == [0, 1, 0, 1]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["LOCAL_RANK 2 but only 2 visible GPU(s): using cuda:0 (ranks share GPUs)"]


def test_deepspeed_init_distributed_with_a_backend_sets_the_device_and_binds_the_group(
    cuda: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")  # two ranks on a one-GPU machine
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
