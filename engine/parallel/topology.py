"""DeepSpeed's process topologies (``deepspeed.runtime.pipe.topology``): named axes laid out
row-major over the global ranks.

``PipeDataParallelTopology(num_pp, num_dp)`` has axes ``['pipe', 'data']`` and
``PipeModelDataParallelTopology(num_pp, num_mp, num_dp)`` has ``['pipe', 'data', 'model']``, so
rank = ``(pipe * dp + data) * mp + model``: the model-parallel (tensor) ranks of one stage are
adjacent (fast links), data-parallel next, pipeline stages furthest apart. :mod:`.mesh` turns a
topology into a ``DeviceMesh`` with the same layout and the axis names ``pp``, ``dp``, ``tp``.
"""

from __future__ import annotations

import itertools
from collections import namedtuple
from typing import Any, cast

AXIS_TO_MESH = {"pipe": "pp", "data": "dp", "model": "tp"}
"""DeepSpeed's axis names -> the DeviceMesh's."""


class ProcessTopology:
    """Cartesian coordinates <-> linear ranks (the methods DeepSpeed's callers use)."""

    def __init__(self, axes: list[str], dims: list[int]) -> None:
        if len(axes) != len(dims) or any(d < 1 for d in dims):
            raise ValueError(f"topology needs one positive size per axis, got {axes} x {dims}")
        self.axes = list(axes)
        self.dims = [int(d) for d in dims]
        self.ProcessCoord: Any = cast(Any, namedtuple)("ProcessCoord", self.axes)
        self.mapping: dict[Any, int] = {
            self.ProcessCoord._make(coord): rank
            for rank, coord in enumerate(itertools.product(*(range(d) for d in self.dims)))
        }
        self._coords = {rank: coord for coord, rank in self.mapping.items()}

    def get_rank(self, **coord_kwargs: int) -> int:
        if len(coord_kwargs) != len(self.axes):
            raise ValueError("get_rank() does not support slices. Use filter_match())")
        return self.mapping[self.ProcessCoord(**coord_kwargs)]

    def get_axis_names(self) -> list[str]:
        return self.axes

    def get_rank_repr(
        self,
        rank: int,
        omit_axes: tuple[str, ...] | list[str] = ("data", "pipe"),
        inner_sep: str = "_",
        outer_sep: str = "-",
    ) -> str:
        coord = self.get_coord(rank)
        return outer_sep.join(
            f"{ax}{inner_sep}{getattr(coord, ax):02d}" for ax in self.axes if ax not in omit_axes
        )

    def get_dim(self, axis: str) -> int:
        """Processes along ``axis`` (0 when the topology has no such axis, as DeepSpeed)."""
        return self.dims[self.axes.index(axis)] if axis in self.axes else 0

    def get_coord(self, rank: int) -> Any:
        try:
            return self._coords[rank]
        except KeyError:
            raise ValueError(f"rank {rank} not found in topology.") from None

    def get_axis_comm_lists(self, axis: str) -> list[list[int]]:
        """Rank lists whose coordinates match in every axis but ``axis`` (one group each)."""
        if axis not in self.axes:
            return []
        others = [a for a in self.axes if a != axis]
        lists = []
        for coord in itertools.product(*(range(self.get_dim(a)) for a in others)):
            fixed = dict(zip(others, coord))
            lists.append(
                [
                    self.mapping[self.ProcessCoord(**fixed, **{axis: i})]
                    for i in range(self.get_dim(axis))
                ]
            )
        return lists

    def filter_match(self, **filter_kwargs: int) -> list[int]:
        return [
            rank
            for coord, rank in self.mapping.items()
            if all(getattr(coord, k) == v for k, v in filter_kwargs.items())
        ]

    def get_axis_list(self, axis: str, idx: int) -> list[int]:
        return self.filter_match(**{axis: idx})

    def world_size(self) -> int:
        return len(self.mapping)

    def __str__(self) -> str:
        return str(self.mapping)


class PipeDataParallelTopology(ProcessTopology):
    """Pipeline x data parallelism; data parallel on the last (fastest-varying) axis."""

    def __init__(self, num_pp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data"], dims=[num_pp, num_dp])


class PipeModelDataParallelTopology(ProcessTopology):
    """Pipeline x data x model (tensor) parallelism."""

    def __init__(self, num_pp: int, num_mp: int, num_dp: int) -> None:
        super().__init__(axes=["pipe", "data", "model"], dims=[num_pp, num_dp, num_mp])
