"""safetensors files without the safetensors package: tensors (and string metadata) on disk
with no pickle, readable by any safetensors reader.

Format: 8-byte little-endian header length, a JSON header of name -> dtype, shape and byte
offsets (plus an optional ``__metadata__`` map of strings), then the raw bytes. Used for the
consolidated 16-bit model (stage 3's ``save_16bit_model``) and, through tensor_tree.py, for
checkpoint files.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping, Sequence
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


class SafetensorsWriter:
    """A safetensors file written one tensor at a time: the header is laid out up front from
    each tensor's name, dtype and shape, then :meth:`write` puts each tensor's bytes at its
    offset, in any order. Only one tensor is ever copied to the host at a time (stage 3's
    consolidated save gathers parameter by parameter into it). Atomic: a temporary file renamed
    into place by :meth:`close`; a failed write leaves no file behind."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        specs: Mapping[str, tuple[torch.dtype, Sequence[int]]],
        metadata: Mapping[str, str] | None = None,
        fsync: bool = False,
    ) -> None:
        header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
        self._offsets: dict[str, tuple[int, int, torch.dtype]] = {}
        offset = 0
        for name, (dtype, shape) in specs.items():
            if dtype not in _DTYPE_NAMES:
                raise ValueError(f"cannot save tensor {name!r} of dtype {dtype} as safetensors")
            nbytes = math.prod(shape) * torch.empty(0, dtype=dtype, device="cpu").element_size()
            header[name] = {
                "dtype": _DTYPE_NAMES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._offsets[name] = (offset, nbytes, dtype)
            offset += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the format aligns the data start to 8 bytes
        self.path = Path(path)
        self._tmp = Path(f"{path}.tmp")
        self._fsync = fsync
        self._data_start = 8 + len(raw)
        self._file = open(self._tmp, "wb")  # noqa: SIM115 (closed by close/abort)
        self._file.write(struct.pack("<Q", len(raw)))
        self._file.write(raw)
        self._file.truncate(self._data_start + offset)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """The bytes of ``name`` (same dtype and element count as declared)."""
        offset, nbytes, dtype = self._offsets[name]
        t = tensor.detach().to("cpu").contiguous()
        if t.dtype != dtype or t.numel() * t.element_size() != nbytes:
            raise ValueError(f"tensor {name!r} is {t.dtype} {tuple(t.shape)}, declared {dtype}")
        if nbytes:
            self._file.seek(self._data_start + offset)
            self._file.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]

    def close(self) -> None:
        """Finish the file and move it into place."""
        if self._fsync:
            self._file.flush()
            os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_safetensors(
    path: str | os.PathLike[str],
    tensors: Mapping[str, torch.Tensor],
    metadata: Mapping[str, str] | None = None,
    fsync: bool = False,
) -> None:
    """Write ``tensors`` (name -> tensor, any of the dtypes above) as one safetensors file,
    atomically (a temporary file renamed into place), with optional string ``metadata``; one
    tensor at a time goes through host memory."""
    specs = {name: (t.dtype, tuple(t.shape)) for name, t in tensors.items()}
    with SafetensorsWriter(path, specs, metadata, fsync=fsync) as writer:
        for name, t in tensors.items():
            writer.write(name, t)


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
            tensors[name] = torch.empty(meta["shape"], dtype=dtype, device="cpu")
            continue
        raw = torch.from_numpy(np.frombuffer(body[start:end], dtype=np.uint8).copy())
        tensors[name] = raw.view(dtype).reshape(meta["shape"])
    return tensors, metadata
