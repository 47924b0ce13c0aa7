"""DeepSpeed's own ZeRO checkpoints, read without DeepSpeed and without running their code, so a
run can move from DeepSpeed to this engine (``python -m zeroscope.engine.zero_to_fp32`` on a
DeepSpeed checkpoint folder).

DeepSpeed writes torch pickles. Its model-states files hold only tensors and containers and load
with ``torch.load(weights_only=True)`` as they are. Its optimizer-states files also pickle three
DeepSpeed objects (``ZeroStageEnum``, ``LossScaler``, ``fragment_address``); they are loaded,
still with ``weights_only=True``, by mapping exactly those names to inert stand-ins here (a
plain ``int`` for the stage, an attribute bag for the others), so neither DeepSpeed nor any
class of the file's choosing is ever imported. A file that needs anything else fails with one
line naming what it asked for.

The consolidation follows DeepSpeed 0.19.8's ``deepspeed/utils/zero_to_fp32.py``:

- stages 1-2: per parameter group, every rank's ``single_partition_of_fp32_groups[g]`` back to
  back is the group's flat fp32 vector; parameters lie in it in ``param_shapes`` order, each
  followed by its ``param_alignment_paddings`` entry;
- stage 3: each rank's ``fp32_flat_groups`` hold its ``ceil(numel / N)``-element slice of every
  parameter in ``param_shapes`` order; a parameter is its N slices end to end, cut to numel;
- frozen parameters come from the model-states files' ``frozen_param_fragments`` (whole at
  stages 0-2, one slice per rank's file at stage 3), buffers from ``module``, tied names from
  ``shared_params``. At stage 1 DeepSpeed records no ``frozen_param_shapes`` and its own script
  drops the frozen parameters; here they are taken from ``module``, which holds them whole.

Stage 0 has no optimizer-states files (DeepSpeed's own script refuses it): its weights are the
``module`` tensors of ``mp_rank_00_model_states.pt``, in the dtype they were trained in.
"""

from __future__ import annotations

import math
import pickle
import re
from pathlib import Path
from typing import Any

import torch

MODEL_FILE = "mp_rank_00_model_states.pt"


class DeepSpeedCheckpointError(ValueError):
    """A DeepSpeed checkpoint that cannot be read safely or does not add up: one line."""


class _ZeroStage(int):
    """Stands in for ``deepspeed.runtime.zero.config.ZeroStageEnum`` (an int enum)."""


class _Opaque:
    """Stands in for a DeepSpeed object the weights do not need: keeps its attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


_STAND_INS: list[Any] = [
    (_ZeroStage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (_Opaque, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (_Opaque, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (_Opaque, "deepspeed.utils.tensor_fragment.fragment_address"),
]


def is_torch_pickle(path: str | Path) -> bool:
    """True for a ``torch.save`` file (a zip archive, or the legacy format whose pickle opens
    with torch's magic number); False for safetensors (8-byte length, then ``{``)."""
    with open(path, "rb") as f:
        head = f.read(9)
    if head[8:9] == b"{":
        return False
    return head[:4] in (b"PK\x03\x04", b"\x80\x02\x8a\x0a")


def load_pickle(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)`` with DeepSpeed's three objects as stand-ins."""
    try:
        with torch.serialization.safe_globals(_STAND_INS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        asked = re.findall(r"GLOBAL ([\w.]+)", str(exc)) or ["an object"]
        raise DeepSpeedCheckpointError(
            f"{path} needs {asked[0]} to load, which loading without running code "
            f"(torch.load weights_only=True) does not allow"
        ) from None


def _detached(tree: Any) -> Any:
    if isinstance(tree, torch.Tensor):
        return tree.detach()
    if isinstance(tree, dict):
        return type(tree)((k, _detached(v)) for k, v in tree.items())
    return tree


def _natural(path: Path) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name)]


def _files(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.glob(pattern), key=_natural)


def _numel(shape: Any) -> int:
    return math.prod(int(d) for d in shape)


def fp32_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """The consolidated fp32 ``state_dict`` of DeepSpeed checkpoint folder ``folder`` (the tag
    folder holding the ``*_model_states.pt`` files)."""
    optim_files = _files(folder, "*_optim_states.pt")
    if (folder / MODEL_FILE).is_file():
        model_files = [folder / MODEL_FILE]
    else:
        model_files = _files(folder, "zero_pp_rank_*_mp_rank_00_model_states.pt")
    if not model_files:
        raise FileNotFoundError(f"{folder} holds no DeepSpeed *_model_states.pt file")
    models = [_detached(load_pickle(f)) for f in model_files]
    first = models[0]
    if "buffer_names" not in first or "module" not in first:
        raise DeepSpeedCheckpointError(f"{model_files[0]} is not a DeepSpeed model-states file")
    out: dict[str, torch.Tensor] = {}
    for name, value in first["module"].items():
        if name in first["buffer_names"]:
            out[name] = value.float() if value.is_floating_point() else value
    if not optim_files:  # stage 0: the module holds the whole weights
        for name, value in first["module"].items():
            out[name] = value.float() if value.is_floating_point() else value
        return out
    optims = [load_pickle(f)["optimizer_state_dict"] for f in optim_files]
    stage = int(optims[0]["zero_stage"])
    world = optims[0]["partition_count"]
    world = max(world) if isinstance(world, list) else int(world)
    if world != len(optims):
        raise DeepSpeedCheckpointError(
            f"{folder} holds {len(optims)} optimizer-states files but was saved by {world} ranks"
        )
    frozen = first.get("frozen_param_shapes") or {}
    for name, shape in frozen.items():
        if stage == 3:
            pieces = [m["frozen_param_fragments"][name].reshape(-1) for m in models]
            out[name] = torch.cat(pieces)[: _numel(shape)].reshape(shape).float()
        else:
            out[name] = first["frozen_param_fragments"][name].reshape(shape).float()
    if stage == 3:
        out.update(_merge_stage3(first["param_shapes"], [o["fp32_flat_groups"] for o in optims]))
    else:
        groups = [o["single_partition_of_fp32_groups"] for o in optims]
        out.update(
            _merge_flat(first["param_shapes"], groups, optims[0].get("param_alignment_paddings"))
        )
    for alias, name in first.get("shared_params", {}).items():
        if name in out:
            out[alias] = out[name]
    if stage < 3:  # DeepSpeed's stage 1 records no frozen_param_shapes; its module has them
        for name, value in first["module"].items():
            if name not in out:
                out[name] = value.float() if value.is_floating_point() else value
    return out


def _merge_flat(
    shapes: list[dict[str, Any]], ranks: list[list[torch.Tensor]], paddings: Any
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for g, group in enumerate(shapes):
        flat = torch.cat([r[g].detach().reshape(-1) for r in ranks]).float()
        offset = 0
        for i, (name, shape) in enumerate(group.items()):
            n = _numel(shape)
            if offset + n > flat.numel():
                raise DeepSpeedCheckpointError(
                    f"parameter {name} lies past the end of group {g}'s {flat.numel()} elements"
                )
            out[name] = flat[offset : offset + n].reshape(shape).clone()
            offset += n + (paddings[g][i] if paddings is not None else 0)
    return out


def _merge_stage3(
    shapes: list[dict[str, Any]], ranks: list[list[torch.Tensor]]
) -> dict[str, torch.Tensor]:
    world = len(ranks)
    # DeepSpeed pickles its fp32 partitions as they were: leaves that require grad.
    flats = [torch.cat([t.detach().reshape(-1) for t in r]).float() for r in ranks]
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name, shape in ((k, v) for group in shapes for k, v in group.items()):
        n = _numel(shape)
        s = math.ceil(n / world)
        if offset + s > flats[0].numel():
            raise DeepSpeedCheckpointError(
                f"parameter {name} lies past the end of the ranks' {flats[0].numel()} elements"
            )
        full = torch.cat([f[offset : offset + s] for f in flats])
        out[name] = full[:n].reshape(shape).clone()
        offset += s
    return out
