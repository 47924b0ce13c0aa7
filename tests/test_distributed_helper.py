"""The multi-rank helper itself: results come back in rank order; a failing rank fails the test
fast with its own traceback instead of hanging its peers; ranks from the DeepSpeed-preloading
server arrive with DeepSpeed imported, and the others without it or Dynamo."""

from __future__ import annotations

import time

import pytest

from tests.distributed import DEEPSPEED, RankFailed, run_ranks


def _all_reduce_rank(rank: int, world: int) -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return float(t.item())


def _rank_one_raises(rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if rank == 1:
        raise RuntimeError("deliberate failure on rank one")
    # Rank 0 would wait forever for rank 1 here; the helper must not.
    dist.all_reduce(torch.ones(1))


def test_results_in_rank_order() -> None:
    assert run_ranks(_all_reduce_rank, 2) == [3.0, 3.0]


def test_failing_rank_fails_fast_with_its_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        run_ranks(_rank_one_raises, 2, timeout=60)
    assert "rank 1 of 2 failed" in str(info.value)
    assert "deliberate failure on rank one" in str(info.value)
    assert time.monotonic() - start < 30


def _arrived_with(rank: int, world: int, names: tuple[str, ...]) -> dict[str, bool]:
    import sys

    return {name: name in sys.modules for name in names}


def test_only_preloaded_ranks_arrive_with_deepspeed() -> None:
    names = ("deepspeed", "torch._dynamo", "tests.deepspeed_ranks")
    # The bundled engine's ranks come from the plain server: neither DeepSpeed nor Dynamo (the
    # agent takes another path once Dynamo is imported).
    assert run_ranks(_arrived_with, 2, names) == [dict.fromkeys(names, False)] * 2
    assert run_ranks(_arrived_with, 2, names, preload=DEEPSPEED) == [dict.fromkeys(names, True)] * 2
    # and they train as the others do
    assert run_ranks(_all_reduce_rank, 2, preload=DEEPSPEED) == [3.0, 3.0]
