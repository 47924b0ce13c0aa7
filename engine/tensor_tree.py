"""Checkpoint files without pickle: a tree of plain values and tensors, as one safetensors file.

``torch.save`` writes a pickle, and the project keeps pickle off the disk (a checkpoint shared
between people must not be able to run code when opened). A checkpoint's content is a tree of
dicts, lists and tuples whose leaves are tensors or plain values (numbers, strings, bools,
None, torch dtypes). :func:`save_tree` stores every tensor under the name ``t<i>`` and the tree
itself, with tensors replaced by ``{"__tensor__": i}``, as JSON in the safetensors metadata, so
the file is also readable by any safetensors reader.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .safetensors_file import read_safetensors, write_safetensors

_TREE_KEY = "zeroscope.tree"


def _encode(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"__tensor__": len(tensors) - 1}
    if isinstance(value, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"checkpoint values must be tensors, numbers, strings, bools, None, or dicts/lists/"
        f"tuples of them; got {type(value).__name__}"
    )


def _decode(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if isinstance(node, dict):
        if "__tensor__" in node:
            return tensors[f"t{node['__tensor__']}"]
        if "__dict__" in node:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in node["__dict__"]}
        if "__tuple__" in node:
            return tuple(_decode(v, tensors) for v in node["__tuple__"])
        if "__dtype__" in node:
            return getattr(torch, node["__dtype__"])
        raise ValueError(f"unknown node {sorted(node)} in checkpoint tree")
    return node


def save_tree(path: str | os.PathLike[str], tree: Any, fsync: bool = True) -> None:
    """Write ``tree`` atomically (temporary file, fsync, rename)."""
    tensors: list[torch.Tensor] = []
    encoded = _encode(tree, tensors)
    write_safetensors(
        path,
        {f"t{i}": t for i, t in enumerate(tensors)},
        metadata={_TREE_KEY: json.dumps(encoded, separators=(",", ":"))},
        fsync=fsync,
    )


def load_tree(path: str | os.PathLike[str]) -> Any:
    """Read a tree written by :func:`save_tree` (tensors on the CPU)."""
    tensors, metadata = read_safetensors(path)
    if _TREE_KEY not in metadata:
        raise ValueError(f"{path} is not a zeroscope checkpoint file (no {_TREE_KEY} metadata)")
    return _decode(json.loads(metadata[_TREE_KEY]), tensors)
