"""Consolidated 16-bit weights of a stage-3 model: ``save_16bit_model``.

DeepSpeed's ``engine.save_16bit_model`` gathers every parameter's shards into full 16-bit
tensors and rank 0 writes them, only when ``stage3_gather_16bit_weights_on_model_save`` is on;
otherwise it logs why and returns False (each rank's checkpoint then holds only its 1/N).

The file is DeepSpeed's ``pytorch_model.bin`` (a ``torch.save``d state dict) unless its name ends
in ``.safetensors`` (engine/model_save.py).
"""

from __future__ import annotations

import logging

from zeroscope.engine.model_save import is_safetensors, load_16bit_model, write_model_file
from zeroscope.engine.safetensors_file import SafetensorsWriter

logger = logging.getLogger(__name__)

__all__ = [
    "NOT_GATHERED",
    "SafetensorsWriter",
    "is_safetensors",
    "load_16bit_model",
    "write_model_file",
]

NOT_GATHERED = (
    "did not save the model {path} because stage3_gather_16bit_weights_on_model_save is false: "
    "under ZeRO stage 3 every rank holds only 1/{world} of each parameter; set it to true in "
    "zero_optimization to consolidate full 16-bit weights on save"
)
