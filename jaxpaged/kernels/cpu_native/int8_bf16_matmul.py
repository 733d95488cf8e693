"""Weight-only int8 on the CPU's bfloat16 pair dot (int8_bf16_matmul.cc: VDPBF16PS, AVX512-BF16), called inside the
jitted step: float rows rounded to bfloat16 times int8 weights packed once at load, widened to bfloat16 in the
kernel, float32 sums, per-column scales on the finished sums.

A weight W [inner, outer] (int8) is packed by pack_int8_pairs into panels [outer / 16, inner', 16] (inner' = inner
rounded up to even, the extra row zeros): panel p holds columns 16p .. 16p + 15 as inner' / 2 rows of 32 bytes, row i
holding (W[2i, c], W[2i + 1, c]) for each column c in turn, the bfloat16 panels' order (packed_matmul.pack_panels).
Built only where this CPU has AVX512-BF16: elsewhere int8_bf16_available() is False and the start-up plan does not
time it. Its numerics are weight-only int8's with the inputs rounded to bfloat16 (8 significant bits), as a
bfloat16 model's matmuls round theirs.
"""

import functools
import pathlib
from collections.abc import Sequence
from typing import Union

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Float32, Int, Int8

from jaxpaged.kernels.cpu_native.native_build import BASE_FLAGS, cpu_identity, register

SOURCE = pathlib.Path(__file__).with_name("int8_bf16_matmul.cc")
TARGET = "jaxpaged_int8_bf16_matmul"
PANEL_WIDTH = 16
"""Columns per panel; a weight packs only when its outer size is a multiple of it."""
MAX_FUSED_WEIGHTS = 4
"""Weights one call takes at most (the kernel's kMaxWeights)."""


@functools.cache
def int8_bf16_available() -> bool:
    """Whether this CPU has AVX512-BF16 and the kernel is built and registered (once per process); False elsewhere,
    and when it cannot be built (logged once)."""
    if "avx512_bf16" not in cpu_identity().split():
        return False
    return register(SOURCE, BASE_FLAGS, "JaxpagedInt8Bf16Matmul", TARGET, fallback="the other int8 matmuls")


def packs_for_int8_bf16(shape: tuple[int, ...]) -> bool:
    """Whether a [inner, outer] weight of this shape packs: outer a positive whole number of panels."""
    return len(shape) == 2 and shape[0] > 0 and shape[1] > 0 and shape[1] % PANEL_WIDTH == 0


def pack_int8_pairs(values: Int8[np.ndarray, "inner outer"]) -> Int8[np.ndarray, "panels inner_even 16"]:
    """int8 W [inner, outer] -> panels [outer / 16, inner rounded up to even, 16] (see the module doc): one host copy,
    once per weight."""
    inner, outer = values.shape
    if values.dtype != np.int8 or not packs_for_int8_bf16(values.shape):
        raise ValueError(f"pack_int8_pairs: int8 weight [inner, outer] with outer a positive multiple of "
                         f"{PANEL_WIDTH}, got {values.dtype} {values.shape}")
    even = inner + inner % 2
    padded = np.zeros((even, outer), np.int8)
    padded[:inner] = values
    # [pairs, 2, panels, 16] -> [panels, pairs, 16, 2]: each panel row holds 16 columns' pairs.
    paired = padded.reshape(even // 2, 2, outer // PANEL_WIDTH, PANEL_WIDTH).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(paired).reshape(outer // PANEL_WIDTH, even, PANEL_WIDTH)


def unpack_int8_pairs(panels: Int8[np.ndarray, "panels inner_even 16"], inner: int) -> Int8[np.ndarray, "inner outer"]:
    """The int8 weight that pack_int8_pairs packed (the tests check packing against it)."""
    num_panels, even, width = panels.shape
    paired = panels.reshape(num_panels, even // 2, width, 2).transpose(1, 3, 0, 2)
    return np.ascontiguousarray(paired.reshape(even, num_panels * width)[:inner])


def int8_bf16_matmuls(x: Float[Array, "rows inner"], weights: Sequence[Int8[Array, "_panels inner_even 16"]],
                      scales: Sequence[Float32[Array, " _outer"]], num_rows: Union[int, Int[Array, ""], None] = None,
                      ) -> tuple[Float32[Array, "rows _outer"], ...]:
    """(bfloat16(x) @ W) * scale for each W of `weights` (pack_int8_pairs) and its per-column `scales`, in one call
    (the products share the threads and x's rows): float32 sums and results. `num_rows` (traced or not; default
    every row): rows from it on are padding, left zeros. CPU only: call int8_bf16_available() first."""
    if not 1 <= len(weights) <= MAX_FUSED_WEIGHTS or len(scales) != len(weights):
        raise ValueError(f"int8_bf16_matmuls: 1 to {MAX_FUSED_WEIGHTS} packed weights, each with its scales; got "
                         f"{len(weights)} weights and {len(scales)} scales")
    rows, inner = x.shape
    x = x.astype(jnp.bfloat16)
    if inner % 2:  # the panels' zero row pairs with a zero input
        x = jnp.pad(x, ((0, 0), (0, 1)))
    shapes = [jax.ShapeDtypeStruct((rows, weight.shape[0] * PANEL_WIDTH), jnp.float32) for weight in weights]
    num_rows = jnp.asarray(rows if num_rows is None else num_rows, jnp.int32).reshape(())
    return tuple(jax.ffi.ffi_call(TARGET, shapes)(x, num_rows, *weights, *(s.astype(jnp.float32) for s in scales)))
