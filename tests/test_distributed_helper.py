"""The multi-rank helper itself: results come back in rank order; a failing rank fails the test
fast with its own traceback instead of hanging its peers."""

from __future__ import annotations

import time

import pytest

from tests.distributed import RankFailed, run_ranks


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
