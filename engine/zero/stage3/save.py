"""Consolidated 16-bit weights of a stage-3 model: ``save_16bit_model``.

DeepSpeed's ``engine.save_16bit_model`` gathers every parameter's shards into full 16-bit
tensors and rank 0 writes them, only when ``stage3_gather_16bit_weights_on_model_save`` is on;
otherwise it logs why and returns False (each rank's checkpoint then holds only its 1/N).

The file is safetensors (8-byte little-endian header length, a JSON header of name -> dtype,
shape, byte offsets, then the raw bytes): no pickle on disk, readable by the ``safetensors``
package and by :func:`load_16bit_model` here without it.
"""

from __future__ import annotations

import logging
import os

import torch

from zeroscope.engine.safetensors_file import SafetensorsWriter, read_safetensors, write_safetensors

logger = logging.getLogger(__name__)

__all__ = ["NOT_GATHERED", "SafetensorsWriter", "load_16bit_model", "write_safetensors"]

NOT_GATHERED = (
    "did not save the model {path} because stage3_gather_16bit_weights_on_model_save is false: "
    "under ZeRO stage 3 every rank holds only 1/{world} of each parameter; set it to true in "
    "zero_optimization to consolidate full 16-bit weights on save"
)


def load_16bit_model(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read the consolidated weights (any safetensors file) as a ``state_dict``."""
    return read_safetensors(path)[0]
