"""w8a8: int8 activations times int8 weights (EngineConfig.quantization = "w8a8"; SGLang's "w8a8_int8").

The weights are int8's (models/int8_weights.py: one float32 scale per output column). Each activation row (token) is
quantized on the fly, symmetric, with its own scale: s_x = max |x_row| / 127, q_x = round(x / s_x), so
|x - q_x * s_x| <= s_x / 2 (an all-zero row, the padding, has scale 0 and q 0). The product is an int8 x int8 dot
accumulated in int32 (jax.lax.dot_general with preferred_element_type int32: the TPU's MXU and GPUs' int8 tensor
cores take it as it is; XLA:CPU runs it as an integer matmul) and scaled back as acc * s_x[row] * s_w[column]. int32
cannot overflow here: |acc| <= 127 * 127 * inner, under 2^31 for inner < 133,000.

On a CPU with VPDPBUSD (AVX-512 VNNI, AVX-VNNI) the same product can run natively against weights packed once at
load (VnniW8A8Weight, kernels/cpu_native/vnni_matmul.py): the rows are quantized by the same rule (by quantize_rows, or
with AVX-512 inside the kernel, the same float32 operations), and the int32 sums are exact either way, so both paths
give the same results.

This is vLLM's dynamic per-token W8A8 (compressed-tensors "input_activations": strategy token, dynamic), so a W8A8
checkpoint runs as it was calibrated.
"""

from collections.abc import Sequence
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Float32, Int, Int8

from jaxpaged.kernels.cpu_native.vnni_matmul import quantizing_vnni_available, vnni_matmuls, vnni_quantizing_matmuls
from jaxpaged.models.int8_weights import INT8_MAX


class W8A8Weight(NamedTuple):
    """A projection whose matmul quantizes its input rows too: int8 values [inner, outer], float32 scales [outer]."""

    values: Int8[Array, "inner outer"]
    """W / scale, rounded."""
    scale: Float32[Array, " outer"]
    """One scale per output column."""


def round_rows(x: Float[Array, "tokens inner"], limit: int,
               ) -> tuple[Float32[Array, "tokens inner"], Float32[Array, "tokens 1"]]:
    """(integers in [-limit, limit] as float32, float32 scale per row): each row symmetric with its own scale,
    s = max |x_row| / limit, values round(x / s), computed in float32. An all-zero row has scale 0 and values 0."""
    x32 = x.astype(jnp.float32)
    scale = jnp.max(jnp.abs(x32), axis=-1, keepdims=True) / limit
    divisor = jnp.where(scale > 0, scale, 1.0)  # an all-zero row: q = 0, whatever its divisor
    return jnp.clip(jnp.round(x32 / divisor), -limit, limit), scale


def quantize_rows(x: Float[Array, "tokens inner"]) -> tuple[Int8[Array, "tokens inner"], Float32[Array, "tokens 1"]]:
    """(int8 values, float32 scale per row) of activations, symmetric per token, computed in float32."""
    values, scale = round_rows(x, INT8_MAX)
    return values.astype(jnp.int8), scale


def w8a8_product(x: Float[Array, "tokens inner"], weight: W8A8Weight) -> Float32[Array, "tokens outer"]:
    """x @ (values * scale) with x quantized per row: an int8 x int8 dot accumulated in int32, then both scales."""
    quantized, row_scale = quantize_rows(x)
    accumulated = jax.lax.dot_general(quantized, weight.values, (((1,), (0,)), ((), ())),
                                      preferred_element_type=jnp.int32)
    return accumulated.astype(jnp.float32) * row_scale * weight.scale


class VnniW8A8Weight(NamedTuple):
    """A w8a8 projection packed for the native VNNI matmul: int8 panels [outer / 16, ceil(inner / 4) + 1, 64]
    (vnni_matmul.pack_vnni) and float32 scales [outer]."""

    panels: Int8[Array, "panels groups_1 64"]
    """W / scale, rounded, in VPDPBUSD's order, with the columns' corrections."""
    scale: Float32[Array, " outer"]
    """One scale per output column."""


def vnni_w8a8_products(x: Float[Array, "tokens inner"], weights: Sequence[VnniW8A8Weight],
                       num_rows: Optional[Int[Array, ""]] = None) -> tuple[Float[Array, "tokens _outer"], ...]:
    """x @ each weight with x quantized per row once for all of them, on the native VNNI matmul (one call): the
    kernel quantizes the rows itself where it can (AVX-512 VNNI), else XLA does (quantize_rows)."""
    if quantizing_vnni_available():
        return vnni_quantizing_matmuls(x, [w.panels for w in weights], [w.scale for w in weights], num_rows=num_rows)
    quantized, row_scale = quantize_rows(x)
    return vnni_matmuls(quantized, row_scale, [w.panels for w in weights], [w.scale for w in weights], num_rows)
