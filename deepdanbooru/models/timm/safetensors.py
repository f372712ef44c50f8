"""Reading a .safetensors file with numpy: every tensor as float32.

The format: 8 bytes (little-endian unsigned) giving the length of a JSON
header, the header (tensor name -> dtype, shape, [begin, end) byte offsets into
the data that follows; an optional "__metadata__" entry), then the raw
little-endian bytes. bfloat16 is the top half of a float32, so widening it is a
16-bit shift; float16 and float32 numpy reads directly. The header alone is read with the standard library
(preflight sizes a --source-model folder from it without numpy).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from deepdanbooru.errors import ModelError, file_field

# dtype name -> (numpy dtype of the stored bytes, bytes per element)
_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}
# A header is a few hundred bytes per tensor; anything near this is not a safetensors file.
_MAX_HEADER = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path) -> tuple[dict[str, TensorInfo], int]:
    """(name -> TensorInfo, offset of the data) without reading the data."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ModelError(file_field(path, None, "is not a safetensors file (shorter than its 8-byte header "
                                                        "length)"))
            (length,) = struct.unpack("<Q", prefix)
            if length > _MAX_HEADER:
                raise ModelError(file_field(path, None, f"is not a safetensors file (header length {length})"))
            raw = handle.read(length)
        header = json.loads(raw.decode("utf-8"))
    except OSError as error:
        raise ModelError(file_field(path, None, f"cannot be read: {error.strerror or error}")) from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(file_field(path, None, "is not a safetensors file (its header is not JSON)")) from None
    if not isinstance(header, dict):
        raise ModelError(file_field(path, None, "is not a safetensors file (its header is not a JSON object)"))
    data_size = path.stat().st_size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
        except (TypeError, KeyError, ValueError):
            raise ModelError(file_field(path, name, "header entry needs dtype, shape and data_offsets")) from None
        if dtype not in _DTYPES:
            raise ModelError(file_field(path, name, f"dtype {dtype} is not supported (F32, F16, BF16, F64)"))
        count = math.prod(shape)
        if not 0 <= begin <= end <= data_size or end - begin != count * _DTYPES[dtype][1]:
            raise ModelError(file_field(path, name, f"data_offsets {[begin, end]} do not fit shape {list(shape)} "
                                                    f"of {dtype} in a file with {data_size} data bytes"))
        tensors[name] = TensorInfo(dtype, shape, begin, end)
    return tensors, 8 + length


def read_tensors(path, names=None) -> dict[str, np.ndarray]:
    """name -> float32 array for `names` (default: every tensor in the file)."""
    path = Path(path)
    tensors, offset = read_header(path)
    wanted = list(tensors) if names is None else list(names)
    out = {}
    with path.open("rb") as handle:
        for name in wanted:
            info = tensors[name]
            handle.seek(offset + info.begin)
            out[name] = _widen(handle.read(info.end - info.begin), info)
    return out


def _widen(content: bytes, info: TensorInfo) -> np.ndarray:
    import numpy as np

    stored, _ = _DTYPES[info.dtype]
    raw = np.frombuffer(content, dtype=stored)
    if info.dtype == "BF16":
        values = (raw.astype(np.uint32) << 16).view(np.float32)
    else:
        values = raw.astype(np.float32)
    return values.reshape(info.shape)
