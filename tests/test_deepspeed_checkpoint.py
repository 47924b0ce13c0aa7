"""Reading DeepSpeed-format checkpoints safely (engine/deepspeed_checkpoint.py), without
DeepSpeed: files built here in DeepSpeed 0.19.8's layout (the real ones are read in
tests/test_differential.py, against DeepSpeed's own zero_to_fp32).

- A stage-2 checkpoint whose optimizer file pickles DeepSpeed's ``ZeroStageEnum`` and
  ``LossScaler`` consolidates: parameters cut from the ranks' flat fp32 partitions with
  DeepSpeed's alignment paddings, the tied name, the frozen parameter, the buffer.
- A file asking for any other class stops zero_to_fp32 with one line naming it, and the class
  is never constructed.
- This engine's ``load_checkpoint`` on a DeepSpeed checkpoint says what to do instead.
"""

from __future__ import annotations

import enum
import sys
from collections import OrderedDict
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest
import torch

CONSTRUCTED: list[str] = []


class ZeroStageEnum(int, enum.Enum):
    """Pickled under DeepSpeed's name below, as DeepSpeed pickles its own."""

    gradients = 2


class LossScaler:
    def __init__(self) -> None:
        self.cur_scale = 1.0


def record(what: str) -> str:
    CONSTRUCTED.append(what)
    return what


class Payload:
    """What a hostile or unknown checkpoint might carry: unpickling it calls ``record``."""

    def __reduce__(self) -> tuple:
        return (record, ("ran",))


_NAMES = {
    ZeroStageEnum: ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    LossScaler: ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
}


def _save_as_deepspeed(obj: object, path: Path) -> None:
    """``torch.save`` with the two classes pickled under DeepSpeed's names: pickle checks a
    name by importing it, so stand-in modules take DeepSpeed's place for the save only."""
    fakes: dict[str, ModuleType] = {}
    for cls, (module, name) in _NAMES.items():
        cls.__module__, cls.__qualname__ = module, name
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            fakes.setdefault(".".join(parts[:i]), ModuleType(".".join(parts[:i])))
        setattr(fakes[module], name, cls)
    with mock.patch.dict(sys.modules, fakes):
        torch.save(obj, path)


def _deepspeed_stage2(folder: Path, *, extra: object = None) -> dict[str, torch.Tensor]:
    """Two ranks' files of a stage-2 checkpoint of: w (2x3), b (3), head tied to w, a frozen
    f (2), a buffer; one group, each parameter padded to 2 elements; returns the weights."""
    w, b = torch.arange(6.0).reshape(2, 3), torch.tensor([7.0, 8.0, 9.0])
    f, buf = torch.tensor([-1.0, -2.0]), torch.tensor([4, 5])
    flat = torch.cat([w.reshape(-1), b, torch.zeros(1)])  # b padded by 1; total 10 -> 2 x 5
    tag = folder / "global_step3"
    tag.mkdir(parents=True)
    (folder / "latest").write_text("global_step3")
    model = {
        "module": OrderedDict(w=w.bfloat16(), b=b.bfloat16(), f=f.bfloat16(), buf=buf),
        "buffer_names": ["buf"],
        "param_shapes": [OrderedDict(w=torch.Size([2, 3]), b=torch.Size([3]))],
        "frozen_param_shapes": OrderedDict(f=torch.Size([2])),
        "frozen_param_fragments": OrderedDict(f=f.bfloat16()),
        "shared_params": {"head": "w"},
        "ds_version": "0.19.8",
    }
    torch.save(model, tag / "mp_rank_00_model_states.pt")
    for rank in range(2):
        optim = {
            "optimizer_state_dict": {
                "zero_stage": ZeroStageEnum.gradients,
                "partition_count": [2],
                "loss_scaler": LossScaler(),
                "single_partition_of_fp32_groups": [flat[rank * 5 : rank * 5 + 5].clone()],
                "param_alignment_paddings": [[0, 1]],
                "extra": extra,
            },
            "ds_version": "0.19.8",
        }
        _save_as_deepspeed(optim, tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    return {"w": w, "b": b, "head": w, "f": f, "buf": buf}


def test_a_deepspeed_stage2_checkpoint_consolidates(tmp_path: Path) -> None:
    from zeroscope.engine.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    want = _deepspeed_stage2(tmp_path)
    got = get_fp32_state_dict_from_zero_checkpoint(str(tmp_path))
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value.float() if value.is_floating_point() else value), key


def test_an_unknown_pickled_object_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zeroscope.engine.zero_to_fp32 import main

    _deepspeed_stage2(tmp_path, extra=Payload())
    CONSTRUCTED.clear()
    assert main([str(tmp_path), str(tmp_path / "out.pt")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"optim_states.pt needs {__name__}.record to load" in err, err
    assert "weights_only=True" in err
    assert CONSTRUCTED == []  # nothing in the file ran
    assert not (tmp_path / "out.pt").exists()


def test_load_checkpoint_names_what_to_do_with_a_deepspeed_checkpoint(tmp_path: Path) -> None:
    from tests.offload_support import build, ds_config

    _deepspeed_stage2(tmp_path)
    run = build(ds_config(2))
    with pytest.raises(ValueError, match=r"torch pickle .*zero_to_fp32"):
        run.engine.load_checkpoint(str(tmp_path))
