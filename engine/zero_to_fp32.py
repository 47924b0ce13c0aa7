"""Consolidate a sharded ZeRO checkpoint into one plain fp32 ``state_dict`` (DeepSpeed's
``zero_to_fp32.py`` job, with its function names)::

    python -m zeroscope.engine.zero_to_fp32 CHECKPOINT_DIR OUTPUT.pt [--tag TAG]

reads ``CHECKPOINT_DIR/latest`` (or ``--tag``), every rank's fp32 master shards and the layout
saved beside them (engine/checkpoint_layout.py), and writes a ``state_dict`` that
``model.load_state_dict(torch.load(OUTPUT.pt, weights_only=True))`` accepts on the plain,
unwrapped model: fp32 weights under every ``state_dict`` name (tied weights under each), the
buffers, and the frozen parameters. It needs no GPU, no process group, and not the model.

The checkpoint may also be one DeepSpeed wrote (torch pickles): it is read without running code
(engine/deepspeed_checkpoint.py), so a run moves between DeepSpeed and this engine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from .checkpoint_files import model_path, optim_file, resolve
from .checkpoint_layout import consolidate
from .deepspeed_checkpoint import DeepSpeedCheckpointError, fp32_state_dict, is_torch_pickle
from .tensor_tree import load_tree


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str, tag: str | None = None
) -> dict[str, torch.Tensor]:
    """The consolidated fp32 ``state_dict`` of a checkpoint (DeepSpeed's function name)."""
    path = resolve(checkpoint_dir, tag)
    if path is None:
        raise FileNotFoundError(f"{checkpoint_dir} has no 'latest' file: pass a tag")
    first = model_path(path)
    if is_torch_pickle(first):
        return fp32_state_dict(path)
    model = load_tree(first)
    world = model["dp_world_size"]
    if "optimizer" in model:  # stage 0: every rank held the same optimizer state
        optims = [model["optimizer"]]
    else:
        optims = []
        for r in range(world):
            file = path / optim_file(r, model["precision"])
            if not file.is_file():
                raise FileNotFoundError(f"{file} is missing: the checkpoint has {world} ranks")
            optims.append(load_tree(file))
    ranks = []
    for optim in optims:
        state = optim["optimizer_state_dict"]
        masters = [s["master"] for s in state["shards"]]
        if state.get("frozen") is not None:  # stage 3: the frozen shards follow the masters
            masters.append(state["frozen"].float())
        ranks.append(masters)
    layout = model["layout"]
    full = consolidate(layout, ranks)
    out: dict[str, torch.Tensor] = {}
    for key, value in model["module"].items():  # buffers (and, below stage 3, frozen weights)
        out[key] = value.float() if value.is_floating_point() else value
    for key, name in layout["aliases"].items():
        if name in full:
            out[key] = full[name]
    return out


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str, output_file: str, tag: str | None = None
) -> dict[str, torch.Tensor]:
    """Write the consolidated fp32 ``state_dict`` with ``torch.save`` (tensors only)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    Path(output_file).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, output_file)
    return state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zeroscope.engine.zero_to_fp32",
        description="Consolidate a sharded ZeRO checkpoint into one fp32 state_dict file.",
    )
    parser.add_argument("checkpoint_dir", help="folder holding 'latest' and the tag folders")
    parser.add_argument("output_file", help="where to write the state_dict (.pt)")
    parser.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: latest)")
    args = parser.parse_args(argv)
    try:
        state = convert_zero_checkpoint_to_fp32_state_dict(
            args.checkpoint_dir, args.output_file, args.tag
        )
    except (FileNotFoundError, KeyError, ValueError, DeepSpeedCheckpointError) as exc:
        print(f"zero_to_fp32: {exc}", file=sys.stderr)
        return 1
    numel = sum(t.numel() for t in state.values())
    print(f"wrote {len(state)} tensors ({numel} elements) to {args.output_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
