"""Weight-only int8 quantization of the decoder's projections (EngineConfig.quantization = "int8").

Each projection W [inner, outer] (q, k, v, o, gate, up, down; stacked: [layers, inner, outer]) becomes an int8
array of the same shape and one float32 scale per output column, symmetric: scale = max |W[:, c]| / 127 and
q = round(W / scale), so |W - q * scale| <= scale / 2 everywhere (an all-zero column has scale 0 and q 0). The
scale sits under its own parameter name beside the weight ("layers.q_proj_scale"), so sharding, per-layer
placement and the memory plan see two plain arrays. Embeddings, lm_head, biases and norms stay in the model dtype:
they are a small share of a decoder's bytes, and the embedding is read a row at a time.

Quantizing happens on the host while the checkpoint loads (weights/param_names.py stack_layers calls
quantize_int8 one layer at a time), or afterwards tensor by tensor (quantize_params) for checkpoints restored
whole. The matmul (layers.py) computes (x @ q.astype(x.dtype)) * scale: the scale multiplies the output, so XLA
fuses the convert into the dot's operand and no dequantized weight is ever stored.
"""

from typing import NamedTuple, Optional

import numpy as np
from jaxtyping import Array, Float, Float32, Int8
from numpy.typing import DTypeLike

from jaxpaged.models.model_config import ModelConfig
from jaxpaged.models.param_shapes import param_shapes

QUANTIZED_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The layer weights (after "layers.") that int8 quantizes: every matmul of the decoder layers."""
QUANTIZED_EXPERTS = ("expert_gate", "expert_up", "expert_down", "shared_gate", "shared_up", "shared_down")
"""A mixture of experts' projections: its stacked experts [E, in, out] (models/moe.py; int8 values, float32 scales
[E, out]) and a shared expert's gated MLP (Qwen2-MoE)."""
SCALE_SUFFIX = "_scale"
"""A quantized weight's scales live under its name plus this suffix ("layers.q_proj_scale")."""
WEIGHT_SCHEMES = ("int8", "w8a8")
"""The schemes whose projections are these int8 weights (w8a8 quantizes the activations too: int8_activations.py)."""
INT8_MAX = 127
"""Symmetric range [-127, 127]: -128 is never used, so negating a weight never overflows."""


class HostInt8(NamedTuple):
    """A pre-quantized projection layer as a checkpoint loader hands it to stack_layers (weights/param_names.py)."""

    values: Int8[np.ndarray, "inner outer"]
    """int8 values [inner, outer] (any memory order: a transposed view of a file's [outer, inner] rows)."""
    scale: Float32[np.ndarray, " outer"]
    """One float32 scale per output column."""


class Int8Weight(NamedTuple):
    """A quantized projection inside the step: its int8 values and its per-output-column float32 scales."""

    values: Int8[Array, "..."]
    """W / scale, rounded: [inner, outer] (or the native matmul's int8 panels [outer / 16, inner, 16])."""
    scale: Float32[Array, " outer"]
    """One scale per output column."""


def is_quantized_projection(name: str) -> bool:
    """Whether `name` (a loader's flat name, "layers.q_proj") is a weight int8 quantization replaces."""
    return name.startswith("layers.") and name[len("layers."):] in QUANTIZED_PROJECTIONS + QUANTIZED_EXPERTS


def scale_name(name: str) -> str:
    """The parameter name of `name`'s scales."""
    return name + SCALE_SUFFIX


def quantize_int8(weight: Float[np.ndarray, "*layers inner outer"],
                  ) -> tuple[Int8[np.ndarray, "*layers inner outer"], Float32[np.ndarray, "*layers outer"]]:
    """(int8 values, float32 scale per output column) of a float weight (any float dtype, any memory order).

    Computed in float32. NOTE: numpy's elementwise ufuncs walk a transposed view (a checkpoint's [outer, inner]
    row-major tensor seen as [inner, outer]) in memory order, so a memory-mapped layer is read front to back; the
    int8 result keeps that order and the caller copies it into place (param_names.py).
    """
    values = np.asarray(weight, dtype=np.float32)
    scale = np.max(np.abs(values), axis=-2) / np.float32(INT8_MAX)
    divisor = np.where(scale > 0, scale, np.float32(1))  # an all-zero column: q = 0, whatever its divisor
    quantized = np.clip(np.rint(values / divisor[..., None, :]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return quantized, scale.astype(np.float32)


def dequantize_int8(values: Int8[np.ndarray, "*layers inner outer"], scale: Float32[np.ndarray, "*layers outer"],
                    ) -> Float32[np.ndarray, "*layers inner outer"]:
    """The float32 weight int8 values and scales stand for (tests and the fake-quantized reference use it)."""
    return values.astype(np.float32) * scale[..., None, :]


def requantize_rows(values: Int8[np.ndarray, "outer inner"], scales: Float32[np.ndarray, "outer groups"],
                    group_size: int) -> HostInt8:
    """Group-wise int8 rows (a file's [outer, inner] weight, one scale per `group_size` input columns of a row: GGUF
    Q8_0, compressed-tensors' group strategy) as per-output-channel int8: dequantized in float32, then quantized
    again per column. NOTE: a second rounding: |W - result| <= (group scale + column scale) / 2, where the column
    scale is the largest of its row's group scales (times 127 / max |q|); one float32 layer is made and let go."""
    outer, inner = values.shape
    groups = scales.shape[1]
    dequantized = np.zeros((outer, groups * group_size), np.float32)
    dequantized[:, :inner] = values
    dequantized.reshape(outer, groups, group_size)[...] *= scales[:, :, None]  # in place: one float32 layer
    requantized, scale = quantize_int8(dequantized[:, :inner].T)
    return HostInt8(requantized, scale)


def quantize_params(params: dict[str, np.ndarray], quantization: Optional[str]) -> dict[str, np.ndarray]:
    """Replace every float projection of `params`, in place, by its int8 values and scales (`quantization` "int8"
    or "w8a8"; None leaves `params` as they are); returns `params`. Tensor by tensor: each float stack is let go as
    soon as it is quantized, so the host holds the float model and one tensor's int8 copy at most (less, as the
    floats go). Projections already quantized (their scale present) are kept."""
    if quantization is None:
        return params
    if quantization not in WEIGHT_SCHEMES:
        raise ValueError(f"quantization: unknown scheme {quantization!r}")
    for name in list(params):
        if is_quantized_projection(name) and scale_name(name) not in params:
            params[name], params[scale_name(name)] = quantize_int8(params[name])
    return params


def scale_shapes(cfg: ModelConfig, names: "set[str] | dict[str, object]") -> dict[str, tuple[int, ...]]:
    """The shapes of the scales among `names` (a model's parameter names): [layers, outer] per quantized weight."""
    shapes = param_shapes(cfg)
    return {scale_name(name): (*shape[:-2], shape[-1]) for name, shape in shapes.items()
            if is_quantized_projection(name) and scale_name(name) in names}


def is_scale(name: str) -> bool:
    """Whether `name` is a quantized weight's scales."""
    return name.endswith(SCALE_SUFFIX) and is_quantized_projection(name[:-len(SCALE_SUFFIX)])


def stored_dtype(name: str, host_dtype: DTypeLike, dtype: DTypeLike) -> np.dtype:
    """The dtype a parameter is placed in: int8 values stay int8 and scales float32; the rest takes `dtype`."""
    if np.dtype(host_dtype) == np.int8:
        return np.dtype(np.int8)
    return np.dtype(np.float32) if is_scale(name) else np.dtype(dtype)
