"""The data loader ``initialize(training_data=...)`` returns, as DeepSpeed builds it
(runtime/dataloader.py ``DeepSpeedDataLoader``, engine.py ``deepspeed_io``)."""

from __future__ import annotations

from typing import Any

from .config import DeepSpeedConfig


def training_loader(
    dataset: Any,
    cfg: DeepSpeedConfig,
    *,
    rank: int,
    world_size: int,
    collate_fn: Any = None,
    batch_size: int | None = None,
) -> Any:
    """DeepSpeed's ``deepspeed_io`` loader: micro-batches of ``train_micro_batch_size_per_gpu``
    through a ``DistributedSampler`` over the data-parallel ranks (shuffled with seed 0 and never
    re-seeded, so every epoch has DeepSpeed's order), ``dataloader_drop_last`` as configured.
    Loading runs in the training process (DeepSpeed starts 2 worker processes per device)."""
    from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

    sampler: Any = None
    if not isinstance(dataset, IterableDataset):
        sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank)
    return DataLoader(
        dataset,
        batch_size=batch_size or cfg.micro_batch,
        sampler=sampler,
        collate_fn=collate_fn,
        drop_last=cfg.dataloader_drop_last,
    )
