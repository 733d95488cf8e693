"""Weight-only int8 on a CPU's int8 dot units: 16-bit activations as two int8 digits (the "int16 digits" matmul).

Why: an int8 weight multiplied by float32 activations must be widened to float32 first, and on a CPU the widened
product runs on the same FMA units as a float32 matmul: the native int8 panels read a quarter of the bytes but are no
faster once a step has more than a few rows (benchmarks/quantization/int8_matmul.py: 1.0x float32 at 64 rows). CPUs
with VNNI or AMX multiply int8 by int8 several times faster than they multiply floats (XLA:CPU's int8 dot uses
them), but quantizing the activations to 8 bits is w8a8, a different model (int8_activations.py). Here each row is
kept to 16 bits instead, then split into two int8 digits so the int8 units can take it:

    s = max |x_row| / 32639,  v = round(x / s) in [-32639, 32639],  v = 256 * hi + lo,
    hi = floor((v + 128) / 256) in [-127, 127],  lo = v - 256 * hi in [-128, 127].

Both digit rows go through ONE int8 x int8 dot, stacked on the row axis ([hi; lo] @ W, int32 sums: |sum| <= 128 *
127 * inner, under 2^31 for inner < 132,000), and come back as (256 * sum_hi + sum_lo) * s * scale[column]. Every
product and sum is an exact integer; the only rounding beyond the weights' own is v's, at most s / 2 = max |x_row| /
65,278 (float32 rounding of x itself is 2^-24 relative: this is ~2^-16 of the row's largest value). So this is the
weight-only int8 model ("W8A16", as vLLM names weight-only int8 with 16-bit activations), not w8a8: its greedy
tokens and log-likelihoods match the int8 panels' (tests/models/test_int16_activations.py).

Stacking the digits is also what makes one-row steps fast: XLA:CPU's int8 dot of a single row takes a slow path
(~10x a two-row dot), and [hi; lo] always has at least two rows.
"""

from collections.abc import Sequence
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Float32, Int, Int8

from jaxpaged.kernels.cpu_native.native_build import cpu_identity
from jaxpaged.kernels.cpu_native.vnni_matmul import quantizing_vnni_available, vnni_matmuls, vnni_quantizing_matmuls
from jaxpaged.models.int8_activations import round_rows

DIGIT_BASE = 256
"""v = DIGIT_BASE * hi + lo."""
V_MAX = 127 * DIGIT_BASE + 127
"""The largest |v| whose high digit stays within [-127, 127] (32,639)."""


class W8A16Weight(NamedTuple):
    """An int8 projection whose matmul splits its input rows into two int8 digits: int8 values [inner, outer] and
    float32 scales [outer] (int8_weights.py's, unpacked)."""

    values: Int8[Array, "inner outer"]
    """W / scale, rounded."""
    scale: Float32[Array, " outer"]
    """One scale per output column."""


def split_rows(x: Float[Array, "tokens inner"],
               ) -> tuple[Int8[Array, "tokens inner"], Int8[Array, "tokens inner"], Float32[Array, "tokens 1"]]:
    """(high digits, low digits, per-row scale) with x ≈ (DIGIT_BASE * hi + lo) * scale, computed in float32. An
    all-zero row (padding) has scale 0 and digits 0."""
    rounded, scale = round_rows(x, V_MAX)
    v = rounded.astype(jnp.int32)
    high = jnp.floor_divide(v + DIGIT_BASE // 2, DIGIT_BASE)
    low = v - DIGIT_BASE * high
    return high.astype(jnp.int8), low.astype(jnp.int8), scale


def w8a16_product(x: Float[Array, "tokens inner"], weight: W8A16Weight) -> Float32[Array, "tokens outer"]:
    """x @ (values * scale) with x kept to 16 bits per row: one int8 x int8 dot of both digit rows, int32 sums."""
    high, low, row_scale = split_rows(x)
    tokens = x.shape[0]
    sums = jax.lax.dot_general(jnp.concatenate([high, low]), weight.values, (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.int32).astype(jnp.float32)
    return (DIGIT_BASE * sums[:tokens] + sums[tokens:]) * row_scale * weight.scale


def cpu_has_int8_dot_units() -> bool:
    """Whether this CPU multiplies int8 by int8 faster than floats (AVX512-VNNI, AVX-VNNI or AMX-INT8): where it does
    not (an AVX2-only CPU), the two digit rows would cost more than the native int8 panels' float32 FMAs."""
    flags = cpu_identity().split()
    return any(flag in flags for flag in ("avx512_vnni", "avx_vnni", "amx_int8"))


class VnniW8A16Weight(NamedTuple):
    """An int8 projection whose inputs are split into two int8 digits for the native VNNI matmul: int8 panels
    (vnni_matmul.pack_vnni) and float32 scales [outer]."""

    panels: Int8[Array, "panels groups_1 64"]
    """W / scale, rounded, in VPDPBUSD's order, with the columns' corrections."""
    scale: Float32[Array, " outer"]
    """One scale per output column."""


def vnni_w8a16_products(x: Float[Array, "tokens inner"], weights: Sequence[VnniW8A16Weight],
                        num_rows: Optional[Int[Array, ""]] = None) -> tuple[Float[Array, "tokens _outer"], ...]:
    """x @ each weight with x kept to 16 bits per row, on the native VNNI matmul: both digit rows in one call (exact
    int32 sums). With AVX-512 VNNI the kernel splits the rows itself and combines each pair of sums as w8a16_product
    does (vnni_quantizing_matmuls; results in x's dtype, padding rows from `num_rows` skipped); else XLA splits them
    and the high digit's rows are scaled by DIGIT_BASE * scale, the low's by scale, then added (`num_rows` unused:
    the stacked digit rows put the padding in the middle, zeros multiplied anyway)."""
    if quantizing_vnni_available():
        return vnni_quantizing_matmuls(x, [w.panels for w in weights], [w.scale for w in weights], digits=True,
                                       num_rows=num_rows)
    high, low, row_scale = split_rows(x)
    tokens = x.shape[0]
    both = vnni_matmuls(jnp.concatenate([high, low]), jnp.concatenate([DIGIT_BASE * row_scale, row_scale]),
                        [w.panels for w in weights], [w.scale for w in weights])
    return tuple(product[:tokens] + product[tokens:] for product in both)
