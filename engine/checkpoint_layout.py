"""Where every parameter's elements sit in the ranks' flat fp32 master shards: the metadata a
checkpoint carries so it can be consolidated without the model (DeepSpeed's zero_to_fp32 reads
``param_shapes`` and the partition sizes from its checkpoint the same way).

Two layouts, as plain lists and dicts (weights_only-loadable):

- ``flat`` (stages 0-2, zero/bucketed.py): per bucket (= per optimizer shard), the parameters'
  names, shapes, offsets and numels in the bucket's flat buffer, padded to ``padded_numel`` and
  cut into ``shards`` equal pieces, piece r on rank r (stage 0: one piece, every rank).
- ``stage3`` (zero/stage3/partition.py): per parameter, its numel, shape, ``shard_numel`` and
  ``offset`` in each rank's flat buffer; rank r holds elements ``[r*s, (r+1)*s)`` of the padded
  parameter. The rank's trainable masters are the first ``trainable_numel`` elements, its
  frozen-parameter shards (saved beside the masters) the rest.

``aliases`` maps every ``state_dict`` key that is a parameter to the parameter's canonical name
(a tied weight appears under each of its names).
"""

from __future__ import annotations

from typing import Any

import torch


def strategy_layout(engine: Any) -> dict[str, Any]:
    module: torch.nn.Module = engine.module
    names = {id(p): n for n, p in module.named_parameters()}
    aliases = {
        key: names[id(value)]
        for key, value in module.state_dict(keep_vars=True).items()
        if id(value) in names
    }
    inner = getattr(engine.strategy, "inner", engine.strategy)
    if hasattr(inner, "partition"):
        part = inner.partition
        return {
            "kind": "stage3",
            "world_size": part.world_size,
            "trainable_numel": sum(s.master.numel() for s in inner.shards),
            "params": [
                {
                    "name": sp.name,
                    "shape": list(sp.shape),
                    "numel": sp.numel,
                    "shard_numel": sp.shard_numel,
                    "offset": sp.offset,
                }
                for sp in part.params
            ],
            "aliases": aliases,
        }
    return {
        "kind": "flat",
        "buckets": [
            {
                "names": [names[id(p)] for p in b.params],
                "shapes": [list(p.shape) for p in b.params],
                "offsets": list(b.layout.offsets),
                "numels": list(b.layout.numels),
                "padded_numel": b.layout.padded_numel,
                "shards": b.layout.world_size,
            }
            for b in inner._buckets
        ],
        "aliases": aliases,
    }


def consolidate(layout: dict[str, Any], ranks: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Full fp32 parameters by canonical name from ``ranks[r]`` = rank r's master shards."""
    full: dict[str, torch.Tensor] = {}
    if layout["kind"] == "stage3":
        world = layout["world_size"]
        flats = [torch.cat([m.reshape(-1) for m in shards]) for shards in ranks]
        for p in layout["params"]:
            start, s = p["offset"], p["shard_numel"]
            if start + s > flats[0].numel():
                continue  # frozen, in a checkpoint that did not keep the frozen shards
            pieces = [flats[r][start : start + s] for r in range(world)]
            full[p["name"]] = torch.cat(pieces)[: p["numel"]].reshape(p["shape"]).clone()
        return full
    for i, bucket in enumerate(layout["buckets"]):
        flat = torch.cat([ranks[r][i].reshape(-1) for r in range(bucket["shards"])])
        assert flat.numel() == bucket["padded_numel"], "shard sizes do not match the layout"
        for name, shape, off, n in zip(
            bucket["names"], bucket["shapes"], bucket["offsets"], bucket["numels"]
        ):
            full[name] = flat[off : off + n].reshape(shape).clone()
    return full
