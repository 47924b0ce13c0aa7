"""Checkpoint files carry no pickle: a tree of tensors and plain values round-trips exactly
through engine/tensor_tree.py, and the file is safetensors, not a torch.save zip."""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import pytest
import torch

from zeroscope.engine.tensor_tree import load_tree, save_tree
from zeroscope.engine.zero.stage3.save import load_16bit_model


def test_tree_round_trips_exactly(tmp_path: Path) -> None:
    tree = {
        "step": 7,
        "scale": 65536.0,
        "nan": float("nan"),
        "name": "global_step7",
        "none": None,
        "flag": True,
        "dtype": torch.bfloat16,
        "state": {0: {"exp_avg": torch.randn(5), "step": torch.tensor(3.0)}, 1: {}},
        "shape": (2, 3),
        "shards": [torch.arange(6, dtype=torch.int64).view(2, 3)[:, 1:], torch.ones(0)],
        "rng": torch.get_rng_state(),
        "half": torch.randn(4).to(torch.float16),
        "bf": torch.randn(4).to(torch.bfloat16),
    }
    path = tmp_path / "x.pt"
    save_tree(path, tree)
    back = load_tree(path)
    assert not zipfile.is_zipfile(path)  # not torch.save's pickle-in-a-zip
    assert set(back) == set(tree)
    assert math.isnan(back.pop("nan")) and math.isnan(tree.pop("nan"))
    for key in ("step", "scale", "name", "none", "flag", "dtype", "shape"):
        assert back[key] == tree[key] and type(back[key]) is type(tree[key])
    assert set(back["state"]) == {0, 1} and back["state"][1] == {}
    assert torch.equal(back["state"][0]["exp_avg"], tree["state"][0]["exp_avg"])
    assert torch.equal(back["shards"][0], tree["shards"][0]) and back["shards"][1].numel() == 0
    for key in ("rng", "half", "bf"):
        assert back[key].dtype == tree[key].dtype and torch.equal(back[key], tree[key])
    # Any safetensors reader sees the tensors.
    assert len(load_16bit_model(path)) == 7


def test_objects_that_would_need_pickle_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="checkpoint values must be"):
        save_tree(tmp_path / "y.pt", {"fn": object()})
    assert not (tmp_path / "y.pt").exists()
