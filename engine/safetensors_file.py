"""safetensors files without the safetensors package: tensors (and string metadata) on disk
with no pickle, readable by any safetensors reader.

Format: 8-byte little-endian header length, a JSON header of name -> dtype, shape and byte
offsets (plus an optional ``__metadata__`` map of strings), then the raw bytes. Used for the
consolidated 16-bit model (stage 3's ``save_16bit_model``) and, through tensor_tree.py, for
checkpoint files.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

_DTYPE_NAMES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_NAME_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    fsync: bool = False,
) -> None:
    """Write ``tensors`` (name -> tensor, any of the dtypes above) as one safetensors file,
    atomically (a temporary file renamed into place), with optional string ``metadata``."""
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    blobs: list[bytes] = []
    offset = 0
    for name, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous()
        if t.dtype not in _DTYPE_NAMES:
            raise ValueError(f"cannot save tensor {name!r} of dtype {t.dtype} as safetensors")
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": _DTYPE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format aligns the data start to 8 bytes
    tmp = Path(f"{path}.tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for data in blobs:
            f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_safetensors(
    path: str | os.PathLike[str],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and the string metadata of a safetensors file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        body = f.read()
    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = header.pop("__metadata__", None) or {}
    for name, meta in header.items():
        start, end = meta["data_offsets"]
        dtype = _NAME_DTYPES[meta["dtype"]]
        if start == end:  # an empty tensor: no bytes to reinterpret
            tensors[name] = torch.empty(meta["shape"], dtype=dtype)
            continue
        raw = torch.from_numpy(np.frombuffer(body[start:end], dtype=np.uint8).copy())
        tensors[name] = raw.view(dtype).reshape(meta["shape"])
    return tensors, metadata
