"""``partition_method='profile'`` measures on rank 0 and broadcasts the layer times over the
pipeline's process group, whose tensors must live on the group's device: NCCL has no CPU
transport, so CPU tensors (what it broadcast before) crash a pipeline job on GPUs at start-up.

On the CPU the group is replaced at the boundary (``dist``'s four calls) and the broadcast
tensors are made on the ``meta`` device, which no CPU default would produce: what the code
hands to ``broadcast`` must carry the device it was given. The 2-rank gloo path, where rank 1
reads the numbers back, is tests/test_pipe_units.py's profile partition.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.distributed import run_ranks
from zeroscope.engine.parallel import profile


def test_rank0_broadcasts_the_layer_times_on_the_groups_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: list[tuple[torch.device, torch.dtype, int]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(
        dist, "broadcast", lambda t, src: sent.append((t.device, t.dtype, t.numel()))
    )
    layers = [nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)]
    times = profile.profiled_weights(
        lambda: layers, torch.zeros(2, 4), repeats=1, device=torch.device("meta")
    )
    assert len(times) == 3 and all(t > 0 for t in times)
    meta = torch.device("meta")
    assert sent == [(meta, torch.int64, 1), (meta, torch.float64, 3)]


def _profiled_on_gpu(rank: int, world: int) -> list[float]:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    layers = [nn.Linear(64, 64).to(device) for _ in range(3)]
    return profile.profiled_weights(
        lambda: layers, torch.zeros(8, 64, device=device), repeats=2, device=device
    )


@pytest.mark.gpu
def test_gpu_profiled_partition_broadcasts_over_nccl() -> None:
    """A one-rank NCCL group: before, the count and the times were CPU tensors and NCCL's
    broadcast refused them ("No backend type associated with device type cpu")."""
    (times,) = run_ranks(_profiled_on_gpu, 1, gpu=True, timeout=300)
    assert len(times) == 3 and all(t > 0 for t in times)
