"""Weights tied across pipeline stages (``TiedLayerSpec``), as DeepSpeed's PipelineModule ties
them (runtime/pipe/module.py ``_index_tied_modules``): one process group per (data replica,
tensor shard) over the stages holding the key; the weights start from the lowest such rank
(broadcast), and after backward their gradients are summed over the group so every copy takes
the same step. In the global gradient norm only the lowest rank's copy counts
(``ds_pipe_replicated`` marks the others, DeepSpeed's attribute).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from .pipe_module import PipelineModule


def _getattr_path(module: Any, path: str) -> Any:
    for item in path.split("."):
        module = getattr(module, item)
    return module


class TiedWeights:
    """The tied keys this rank holds and the groups that share them."""

    def __init__(self, owner: PipelineModule) -> None:
        from .pipe_module import TiedLayerSpec

        self.owner = owner
        self.comms: dict[str, dict[str, Any]] = {}
        for p in owner.parameters():
            p.ds_pipe_replicated = False  # type: ignore[attr-defined]
        specs = owner._layer_specs
        keys = sorted({s.key for s in specs if isinstance(s, TiedLayerSpec)})
        if owner.num_stages == 1 or not keys or not dist.is_initialized():
            return
        topo, coords = owner.topology(), owner.mesh.coords
        for key in keys:
            stages = sorted(
                {
                    owner.stage_owner(i)
                    for i, s in enumerate(specs)
                    if isinstance(s, TiedLayerSpec) and s.key == key
                }
            )
            for dp in range(coords.dp_size):
                for tp in range(coords.tp_size):
                    ranks = [self._rank_of(topo, stage, dp, tp) for stage in stages]
                    group = dist.new_group(ranks=ranks)  # every rank creates every group
                    if owner.global_rank not in ranks:
                        continue
                    self.comms[key] = {
                        "ranks": ranks,
                        "group": group,
                        "weight_attr": owner.tied_weight_attrs[key],
                        "module": owner.tied_modules[key],
                    }
                    if owner.global_rank != ranks[0]:
                        for p in owner.tied_modules[key].parameters():
                            p.ds_pipe_replicated = True  # type: ignore[attr-defined]
        self._synchronize()

    @staticmethod
    def _rank_of(topo: Any, stage: int, dp: int, tp: int) -> int:
        coord = {"pipe": stage, "data": dp, "model": tp}
        return int(topo.get_rank(**{a: coord[a] for a in topo.get_axis_names()}))

    def _synchronize(self) -> None:
        for comm in self.comms.values():
            if len(comm["ranks"]) < 2:
                continue
            for attr in comm["weight_attr"]:
                weight = _getattr_path(comm["module"], attr)
                with torch.no_grad():
                    dist.broadcast(weight.data, src=comm["ranks"][0], group=comm["group"])

    def weights_and_groups(self) -> list[tuple[torch.Tensor, Any]]:
        return [
            (_getattr_path(comm["module"], attr), comm["group"])
            for comm in self.comms.values()
            for attr in comm["weight_attr"]
        ]

    def allreduce_grads(self) -> None:
        """Sum each tied weight's gradient over the stages holding it (before the data-parallel
        reduction, as DeepSpeed's ``_exec_reduce_tied_grads``)."""
        for comm in self.comms.values():
            if len(comm["ranks"]) < 2:
                continue
            for attr in comm["weight_attr"]:
                grad = _getattr_path(comm["module"], attr).grad
                if grad is not None:
                    dist.all_reduce(grad, group=comm["group"])
