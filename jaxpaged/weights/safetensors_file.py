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

import ml_dtypes
import numpy as np

# safetensors dtype tag -> numpy dtype (bfloat16 comes from ml_dtypes, the type JAX itself uses).
_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32),
    "F64": np.dtype(np.float64),
}
_QUANTIZED_DTYPES: dict[str, np.dtype] = {"I8": np.dtype(np.int8)}
"""Read only where the caller knows the checkpoint's quantization (weights/compressed_tensors.py)."""
_MAX_HEADER_BYTES = 100 * 2**20  # the format's own limit; a bigger "length" means the file is not safetensors


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
    """Every tensor of `file`; ValueError when the file is truncated or not safetensors."""
    size = file.stat().st_size
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{file}: too short to be a safetensors file (an interrupted download?)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise ValueError(f"{file}: not a safetensors file (header length {header_len}, file size {size})")
        header = json.loads(handle.read(header_len))
    data_start = 8 + header_len
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        entry = TensorEntry(file, name, info["dtype"], tuple(info["shape"]), data_start + begin, end - begin)
        if data_start + end > size:
            raise ValueError(f"{file}: tensor {name!r} runs past the end of the file (an interrupted download?)")
        entries[name] = entry
    return entries


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
