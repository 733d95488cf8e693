"""Read .safetensors files as memory-mapped numpy arrays in the file's own dtype.

The format is an 8-byte little-endian header length, a JSON header ({name: {dtype, shape, data_offsets}}) and the
raw tensor bytes. Reading it ourselves (rather than through the safetensors package) lets every tensor be a
read-only np.memmap: nothing is copied or converted until the caller asks, so a bf16 checkpoint never passes
through a float32 copy on the host.
"""

import dataclasses
import json
import math
import pathlib
import struct
from collections.abc import Iterable
from typing import Any, Optional

import ml_dtypes
import numpy as np

# safetensors dtype tag -> numpy dtype (bfloat16 comes from ml_dtypes, the type JAX itself uses).
_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}
_QUANTIZED_DTYPES: dict[str, np.dtype] = {"I8": np.dtype(np.int8), "U8": np.dtype(np.uint8)}
"""Read only where the caller knows the checkpoint's quantization (weights/compressed_tensors.py; MXFP4's packed
uint8 blocks and scales: weights/mxfp4.py)."""
_MAX_HEADER_BYTES = 100 * 2**20  # the format's own limit; a bigger "length" means the file is not safetensors
_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64, "C64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}
"""Bits per element of every dtype tag the format defines: a header's byte ranges are checked against them even for
tensors jaxpaged never reads."""


@dataclasses.dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives in its file."""

    file: pathlib.Path
    name: str
    dtype: str
    """The safetensors tag ("BF16", "F32", ...)."""
    shape: tuple[int, ...]
    offset: int
    """Absolute byte offset of the first element in the file."""
    nbytes: int


def read_header(file: pathlib.Path) -> dict[str, TensorEntry]:
    """Every tensor of `file`; ValueError when the file is truncated or not safetensors, or (naming the tensor) when
    a tensor's byte range is negative, reversed, past the end, overlaps another's or is not its dtype x shape size."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{file}: too short to be a safetensors file (an interrupted download?)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > _MAX_HEADER_BYTES:
            raise ValueError(f"{file}: not a safetensors file (header length {header_len} is over the format's "
                             f"{_MAX_HEADER_BYTES // 2**20} MiB limit)")
        if header_len > size - 8:
            raise ValueError(f"{file}: not a safetensors file (header length {header_len}, file size {size})")
        try:
            header = json.loads(handle.read(header_len), object_pairs_hook=_no_duplicate_names)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
            raise ValueError(f"{file}: not a safetensors file (its header is not JSON: {error})") from None
        except ValueError as error:  # a name given twice
            raise ValueError(f"{file}: {error}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: not a safetensors file (its header is not a JSON object)")
    data_start = 8 + header_len
    entries = {name: _entry(file, name, info, data_start, size) for name, info in header.items()
               if name != "__metadata__"}
    _check_disjoint(file, entries.values())
    return entries


def _no_duplicate_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [name for name, _ in pairs]
    duplicated = {name for name in names if names.count(name) > 1}
    if duplicated:
        raise ValueError(f"tensor {sorted(duplicated)[0]!r} is named twice")
    return dict(pairs)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(file: pathlib.Path, name: str, info: object, data_start: int, size: int) -> TensorEntry:
    """One header entry, checked: a known dtype, a shape of counts, and [begin, end] offsets inside the file that
    span exactly dtype x shape bytes."""
    where = f"{file}: tensor {name!r}"
    if not isinstance(info, dict):
        raise ValueError(f"{where}: its header entry is not an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _DTYPE_BITS:
        raise ValueError(f"{where}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_count(n) for n in shape):
        raise ValueError(f"{where}: shape {shape!r} is not a list of non-negative ints")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(n) for n in offsets)
            and offsets[0] <= offsets[1]):
        raise ValueError(f"{where}: data_offsets {offsets!r} must be [begin, end] with 0 <= begin <= end")
    begin, end = offsets
    if data_start + end > size:
        raise ValueError(f"{where} runs past the end of the file (an interrupted download?)")
    bits = math.prod(shape) * _DTYPE_BITS[dtype]
    if bits != (end - begin) * 8:
        raise ValueError(f"{where}: data_offsets {offsets} span {end - begin} bytes, but {dtype} of shape "
                         f"{tuple(shape)} is {bits / 8:g} bytes")
    return TensorEntry(file, name, dtype, tuple(shape), data_start + begin, end - begin)


def _check_disjoint(file: pathlib.Path, entries: Iterable[TensorEntry]) -> None:
    """ValueError naming both tensors when two byte ranges overlap (in whatever order the header lists them)."""
    previous: Optional[TensorEntry] = None
    for entry in sorted((e for e in entries if e.nbytes), key=lambda e: e.offset):
        if previous is not None and entry.offset < previous.offset + previous.nbytes:
            raise ValueError(f"{file}: tensor {entry.name!r} overlaps tensor {previous.name!r} (data_offsets "
                             f"share bytes): not a valid safetensors file")
        if previous is None or entry.offset + entry.nbytes > previous.offset + previous.nbytes:
            previous = entry


def open_tensor(entry: TensorEntry, quantized: bool = False) -> np.ndarray:
    """The tensor as a read-only array over the file's pages (no copy); int8 tensors only when `quantized` (the
    checkpoint's quantization_config says what they mean).

    Each tensor gets its own mapping, so once the caller drops the array its pages leave the process's resident
    set; one mapping of the whole file would keep every page read so far resident until the end of the load.
    """
    dtype = _DTYPES.get(entry.dtype) or (_QUANTIZED_DTYPES.get(entry.dtype) if quantized else None)
    if dtype is None:
        raise ValueError(f"{entry.file}: tensor {entry.name!r} has dtype {entry.dtype}; jaxpaged reads "
                         f"{', '.join(_DTYPES)} checkpoints, and int8 ones whose config.json has a compressed-tensors "
                         "quantization_config")
    count = math.prod(entry.shape)
    if count * dtype.itemsize != entry.nbytes:
        raise ValueError(f"{entry.file}: tensor {entry.name!r} holds {entry.nbytes} bytes, "
                         f"not the {count * dtype.itemsize} its shape {entry.shape} needs")
    if count == 0:  # mmap cannot map zero bytes
        return np.empty(entry.shape, dtype)
    flat = np.memmap(entry.file, dtype=dtype, mode="r", offset=entry.offset, shape=(count,))
    # A plain ndarray view (its base keeps the mapping alive): np.memmap's subclass would leak into every result
    # computed from it.
    return flat.view(np.ndarray).reshape(entry.shape)
