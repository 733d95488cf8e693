"""Turning per-layer checkpoint tensors into jaxpaged's stacked parameter dict."""

import sys
from collections.abc import Callable
from typing import Optional

import numpy as np
from tqdm.auto import tqdm

from jaxpaged.models.int8_weights import HostInt8, is_quantized_projection, quantize_int8, scale_name
from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.param_shapes import param_shapes

_COPY_BLOCK = 256
"""Columns per block when copying a transposed view: each block reads a contiguous run of the source rows."""


Fetch = Callable[[str, Optional[int]], "np.ndarray | HostInt8"]
"""fetch(name, layer): one layer's tensor (layer None: a global weight); a pre-quantized projection as HostInt8."""


def stack_layers(cfg: ModelConfig, fetch: Fetch,
                 quantization: Optional[str] = None, progress: Optional[bool] = None) -> dict[str, np.ndarray]:
    """Build every parameter by calling fetch(name, layer) per layer (layer None for global weights).

    fetch returns arrays already in jaxpaged's orientation ([in, out] for projections), in any dtype; a stacked
    parameter takes the dtype of its first layer. Layers are copied one at a time into the stacked array, so a
    memory-mapped source is only ever resident one tensor at a time; global weights are kept as fetch returns
    them (still lazy when fetch maps a file). `quantization` "int8": each projection layer is quantized as it is
    read (models/int8_weights.py), so the host holds the int8 stacks and one float layer, never the float model;
    a projection layer fetch returns already quantized (HostInt8: a pre-quantized checkpoint's) is copied as it is.
    `progress`: a bar of tensors read on stderr (None: when stderr is a terminal); copying a mapped layer is where
    its bytes are read from disk, and quantizing is the slow part of an int8 load, so this bar is the load's.
    """
    shapes = param_shapes(cfg)
    num_fetches = sum(cfg.num_layers if name.startswith("layers.") else 1 for name in shapes)
    action = "Reading weights" if quantization is None else f"Reading weights, quantizing to {quantization}"
    bar = tqdm(total=num_fetches, desc=action, unit="tensor", file=sys.stderr, leave=False,
               disable=None if progress is None else not progress)

    def fetch_counted(name: str, layer: Optional[int]) -> "np.ndarray | HostInt8":
        value = fetch(name, layer)
        bar.update(1)
        return value

    with bar:
        return _stack_all(cfg, shapes, fetch_counted, quantization)


def _stack_all(cfg: ModelConfig, shapes: dict[str, tuple[int, ...]], fetch: Fetch,
               quantization: Optional[str]) -> dict[str, np.ndarray]:
    params = {}
    for name, shape in shapes.items():
        if not name.startswith("layers."):
            params[name] = _checked(_float(fetch(name, None), name), shape, name)
            continue
        short = name[len("layers."):]
        if quantization is not None and is_quantized_projection(name):
            params[name], params[scale_name(name)] = _stack_quantized(cfg, fetch, name, shape)
            continue
        stacked: Optional[np.ndarray] = None
        for layer in range(cfg.num_layers):
            value = _checked(_float(fetch(short, layer), name), shape[1:], f"{name}[{layer}]")
            if stacked is None:
                stacked = np.empty(shape, dtype=value.dtype)
            _copy_into(stacked[layer], value)
            del value  # unmaps this layer's tensor before the next one is read
        params[name] = stacked if stacked is not None else np.empty(shape, dtype=np.float32)
    return params


def _stack_quantized(cfg: ModelConfig, fetch: Fetch, name: str,
                     shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """One stacked projection as int8 values and float32 scales, quantized layer by layer (or copied, when fetch
    hands a layer over quantized)."""
    values = np.empty(shape, dtype=np.int8)
    scales = np.empty((*shape[:-2], shape[-1]), dtype=np.float32)
    for layer in range(cfg.num_layers):
        value = fetch(name[len("layers."):], layer)
        quantized, scale = value if isinstance(value, HostInt8) else quantize_int8(value)
        _copy_into(values[layer], _checked(quantized, shape[1:], f"{name}[{layer}]"))
        scales[layer] = _checked(scale, scales.shape[1:], f"{scale_name(name)}[{layer}]")
        del value, quantized
    return values, scales


def _float(value: "np.ndarray | HostInt8", name: str) -> np.ndarray:
    if isinstance(value, HostInt8):
        raise ValueError(f"checkpoint tensor {name}: int8 here needs quantization (the loader asks for none)")
    return value


def _checked(value: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    if value.shape != shape:
        raise ValueError(f"checkpoint tensor {name}: expected shape {shape}, got {value.shape}")
    return value


def _copy_into(target: np.ndarray, value: np.ndarray) -> None:
    """target[...] = value, in column blocks when value is a transposed view.

    A whole-matrix copy from a transposed view walks the source a column at a time, striding across every row
    (and, for a mapped file, every page) per output row; copying blocks of columns reads the source in contiguous
    row runs, which is several times faster for the large projection matrices.
    """
    if value.ndim != 2 or value.flags.c_contiguous:
        target[...] = value
        return
    for start in range(0, value.shape[1], _COPY_BLOCK):
        target[:, start:start + _COPY_BLOCK] = value[:, start:start + _COPY_BLOCK]
