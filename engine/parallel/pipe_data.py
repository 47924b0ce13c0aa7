"""Micro-batches for a pipeline: DeepSpeed's RepeatingLoader and the loader it builds from
``training_data`` (runtime/pipe/engine.py ``_build_data_iter``): a DistributedSampler over the
data-parallel replicas, in order (``shuffle=False``), ``train_micro_batch_size_per_gpu`` samples
per batch. Only the first and last stages read data (inputs and labels)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class RepeatingLoader:
    """Wraps an iterable (a DataLoader) and restarts it when exhausted."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)


def pipeline_loader(
    dataset: Any, *, micro_batch: int, dp_size: int, dp_rank: int, collate_fn: Any = None
) -> RepeatingLoader:
    """DeepSpeed's pipeline data loader for ``dataset`` on this data-parallel rank."""
    from torch.utils.data import DataLoader, DistributedSampler

    sampler: Any = DistributedSampler(dataset, num_replicas=dp_size, rank=dp_rank, shuffle=False)
    return RepeatingLoader(
        DataLoader(dataset, batch_size=micro_batch, sampler=sampler, collate_fn=collate_fn)
    )
