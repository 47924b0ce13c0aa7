"""The file ``save_16bit_model`` writes, as DeepSpeed names and formats it.

DeepSpeed's default ``save_filename`` is ``pytorch_model.bin``: a ``torch.save``d state dict,
which scripts and the Hugging Face tooling read back with ``torch.load``. A name ending in
``.safetensors`` gets a real safetensors file (no pickle); DeepSpeed 0.19.8 ``torch.save``s
whatever the name, so a ``model.safetensors`` from DeepSpeed is a pickle that safetensors
readers reject: here it is what its name says.

Tensors are cloned before ``torch.save``: a parameter that is a view into a flat ZeRO buffer
would otherwise drag the whole buffer into the file (``torch.save`` writes views' storages).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from .safetensors_file import read_safetensors, write_safetensors


def is_safetensors(path: str | os.PathLike[str]) -> bool:
    return os.fspath(path).endswith(".safetensors")


def write_model_file(path: str | os.PathLike[str], state_dict: Mapping[str, torch.Tensor]) -> None:
    """Write ``state_dict`` to ``path``: safetensors when the name says so, else torch.save."""
    if is_safetensors(path):
        write_safetensors(path, state_dict)
        return
    cloned = {name: t.detach().clone().cpu() for name, t in state_dict.items()}
    tmp = f"{os.fspath(path)}.tmp"
    torch.save(cloned, tmp)
    os.replace(tmp, path)


def load_16bit_model(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a file written by ``save_16bit_model`` (either format, whatever its name: the
    content says which) as a ``state_dict``, without running pickled code
    (``weights_only=True``)."""
    with open(path, "rb") as f:
        head = f.read(9)
        if len(head) == 9 and head[8:9] == b"{":  # 8-byte header length, then JSON
            return read_safetensors(path)[0]
        f.seek(0)
        # a file object: torch.load would pick its reader by a ".safetensors" name
        return dict(torch.load(f, map_location="cpu", weights_only=True))
