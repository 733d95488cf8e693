"""The native CPU matmul against pre-packed weights (packed_matmul.cc), called inside the jitted step: float32,
bfloat16 where the CPU has AVX512-BF16, and int8 weights with per-column float32 scales (packed_int8_matmuls).

A weight W [inner, outer] is packed once, on the host at load time, into panels [outer / 16, inner, 16]: panel p
holds columns 16p .. 16p + 15. In float32 each panel is one contiguous 16-float row per inner index, the order the
kernel's register tiles read. In bfloat16 the panel holds the same values in the same shape, ordered as rows of 16
(W[2i, c], W[2i + 1, c]) pairs, the order of the CPU's bfloat16 pair dot instruction (so inner must be even).
XLA:CPU's dot library does that packing on every call instead; at a decode step's 64 rows it cost a fifth of the
step (benchmarks/cpu_matmul.py measures both). Without a compiler, or with cpu_matmul="xla" (EngineConfig), weights stay
unpacked and XLA's dot runs.
"""

import functools
import pathlib
from collections.abc import Sequence
from typing import Union

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Float32, Int, Int8, Shaped

from jaxpaged.kernels.cpu_native.native_build import BASE_FLAGS, cpu_identity, register

SOURCE = pathlib.Path(__file__).with_name("packed_matmul.cc")
TARGET = "jaxpaged_packed_matmul"
TARGET_BFLOAT16 = "jaxpaged_packed_matmul_bf16"
TARGET_BFLOAT16_OUT = "jaxpaged_packed_matmul_bf16_out_bf16"
TARGET_INT8 = "jaxpaged_packed_matmul_int8"
# FMA contraction is what the kernel is written for (GCC leaves it off under -std=c++17).
FLAGS = (*BASE_FLAGS, "-ffp-contract=fast")
PANEL_WIDTH = 16
"""Columns per panel; a weight packs only when its outer size is a multiple of it."""


@functools.cache
def packed_matmul_available() -> bool:
    """Whether the float32 kernel is built and registered (once per process); False when it cannot be built (logged
    once). Whether the engine uses it is the start-up plan's choice (EngineConfig.cpu_matmul)."""
    return register(SOURCE, FLAGS, "JaxpagedPackedMatmul", TARGET, fallback="XLA's dot on unpacked weights")


@functools.cache
def packed_bfloat16_available() -> bool:
    """Whether the bfloat16 kernel is built and registered: only where this CPU has AVX512-BF16 (the library exports
    it only then) and no AMX; otherwise bfloat16 weights stay unpacked for XLA's dot. AMX tiles run XLA's bfloat16
    dots faster than this kernel's VDPBF16PS can reach (figures: docs/performance.md, known gaps), so AMX machines
    keep XLA's dot."""
    flags = cpu_identity().split()
    if "avx512_bf16" not in flags or "amx_bf16" in flags:
        return False
    fallback = "XLA's dot on unpacked bfloat16 weights"
    return (register(SOURCE, FLAGS, "JaxpagedPackedMatmulBfloat16", TARGET_BFLOAT16, fallback)
            and register(SOURCE, FLAGS, "JaxpagedPackedMatmulBfloat16Out", TARGET_BFLOAT16_OUT, fallback))


@functools.cache
def packed_int8_available() -> bool:
    """Whether the int8 kernel (int8 panels, float32 x and sums, column scales) is built and registered."""
    return register(SOURCE, FLAGS, "JaxpagedPackedMatmulInt8", TARGET_INT8,
                    fallback="XLA's dot on unpacked int8 weights")


def packs_dtype(dtype) -> bool:
    """Whether weights in `dtype` pack on this CPU (the kernel for it is built and registered)."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float32:
        return packed_matmul_available()
    if dtype == jnp.int8:
        return packed_int8_available()
    return dtype == jnp.bfloat16 and packed_bfloat16_available()


def fills_whole_panels(shape: tuple[int, ...], dtype=jnp.float32) -> bool:
    """Whether a [inner, outer] weight of this shape can be packed in `dtype`: outer a positive whole number of
    panels, and in bfloat16 an even inner size (the kernel multiplies pairs)."""
    if len(shape) != 2 or shape[1] % PANEL_WIDTH != 0 or shape[1] <= 0:
        return False
    return jnp.dtype(dtype) != jnp.bfloat16 or shape[0] % 2 == 0


def pack_panels(weight: Shaped[np.ndarray, "inner outer"]) -> Shaped[np.ndarray, "panels inner 16"]:
    """W [inner, outer] -> panels [outer / 16, inner, 16] in W's dtype (bfloat16: pairs, see the module doc): one host
    copy, once per weight. A weight that is the transpose of a row-major array (how checkpoints store [outer, inner]
    projections, and a tied embedding) is read in that array's row order, so a memory-mapped file is read front to
    back, not one strided column at a time."""
    inner, outer = weight.shape
    if not fills_whole_panels(weight.shape, weight.dtype):
        raise ValueError(f"weight of shape {weight.shape}: outer size must be a positive multiple of {PANEL_WIDTH}"
                         f"{' and inner size even' if weight.dtype == jnp.bfloat16 else ''}")
    if weight.dtype == jnp.bfloat16:
        # [inner / 2, 2, outer / 16, 16] -> [outer / 16, inner / 2, 16, 2]: each row holds 16 columns' pairs.
        paired = weight.reshape(inner // 2, 2, outer // PANEL_WIDTH, PANEL_WIDTH).transpose(2, 0, 3, 1)
        return np.ascontiguousarray(paired).reshape(outer // PANEL_WIDTH, inner, PANEL_WIDTH)
    if not weight.flags.c_contiguous and weight.T.flags.c_contiguous:
        rows = weight.T  # [outer, inner], row-major
        return np.ascontiguousarray(rows.reshape(outer // PANEL_WIDTH, PANEL_WIDTH, inner).transpose(0, 2, 1))
    return np.ascontiguousarray(weight.reshape(inner, outer // PANEL_WIDTH, PANEL_WIDTH).transpose(1, 0, 2))


def unpack_panels(panels: Shaped[np.ndarray, "panels inner 16"]) -> Shaped[np.ndarray, "inner outer"]:
    """The inverse of pack_panels (the tests check packing against it)."""
    num_panels, inner, width = panels.shape
    if panels.dtype == jnp.bfloat16:
        paired = panels.reshape(num_panels, inner // 2, width, 2).transpose(1, 3, 0, 2)
        return np.ascontiguousarray(paired).reshape(inner, num_panels * width)
    return np.ascontiguousarray(panels.transpose(1, 0, 2).reshape(inner, num_panels * width))


def panel_columns(panels: Float[Array, "panels inner 16"], columns: Int[Array, " n"]) -> Float[Array, "n inner"]:
    """Columns of the packed W, as rows (a tied embedding's token rows): column c is column c % 16 of panel c // 16."""
    if panels.dtype == jnp.bfloat16:
        num_panels, inner, width = panels.shape
        paired = panels.reshape(num_panels, inner // 2, width, 2)[columns // PANEL_WIDTH, :, columns % PANEL_WIDTH]
        return paired.reshape(columns.shape[0], inner)
    return panels[columns // PANEL_WIDTH, :, columns % PANEL_WIDTH]


MAX_FUSED_WEIGHTS = 4
"""Weights one packed_matmuls call takes at most (the kernel's kMaxWeights)."""


def packed_matmuls(x: Float[Array, "rows inner"], weights: Sequence[Float[Array, "_panels inner 16"]],
                   out_dtype=jnp.float32, num_rows: Union[int, Int[Array, ""], None] = None,
                   ) -> tuple[Float[Array, "rows _outer"], ...]:
    """x @ W for each W of `weights` (packed by pack_panels, all in one dtype), in one call: the products' work items
    share the threads and each row block of x while it is in cache, as q, k and v (or gate and up) can. Float32 sums
    in the panels' dtype (x is cast to it); results in float32, or in `out_dtype` bfloat16 for bfloat16 panels
    (rounded in the kernel). `num_rows` (traced or not; default: every row): only rows [0, num_rows) are multiplied,
    the rest of each result is zeros, so a step padded to its bucket pays only for its real rows. CPU only: call
    packed_matmul_available() / packed_bfloat16_available() first."""
    dtypes = {jnp.dtype(weight.dtype) for weight in weights}
    if len(dtypes) != 1 or not 1 <= len(weights) <= MAX_FUSED_WEIGHTS:
        raise ValueError(f"packed_matmuls: 1 to {MAX_FUSED_WEIGHTS} weights of one dtype, got "
                         f"{[str(weight.dtype) for weight in weights]}")
    dtype = dtypes.pop()
    if dtype != jnp.bfloat16:
        target, result_dtype = TARGET, jnp.float32
    elif jnp.dtype(out_dtype) == jnp.bfloat16:
        target, result_dtype = TARGET_BFLOAT16_OUT, jnp.bfloat16
    else:
        target, result_dtype = TARGET_BFLOAT16, jnp.float32
    rows = x.shape[0]
    shapes = [jax.ShapeDtypeStruct((rows, weight.shape[0] * PANEL_WIDTH), result_dtype) for weight in weights]
    num_rows = jnp.asarray(rows if num_rows is None else num_rows, jnp.int32).reshape(())
    return tuple(jax.ffi.ffi_call(target, shapes)(x.astype(dtype), num_rows, *weights))


def packed_int8_matmuls(x: Float[Array, "rows inner"], weights: Sequence[Int8[Array, "_panels inner 16"]],
                        scales: Sequence[Float32[Array, " _outer"]], num_rows: Union[int, Int[Array, ""], None] = None,
                        ) -> tuple[Float32[Array, "rows _outer"], ...]:
    """(x @ W) * scale for each int8 W of `weights` (packed by pack_panels, in float32's order) and its per-column
    `scales`, in one call, as packed_matmuls: x is cast to float32, the int8 values are widened in registers, sums and
    results are float32. CPU only: call packed_int8_available() first."""
    if not 1 <= len(weights) <= MAX_FUSED_WEIGHTS or len(scales) != len(weights):
        raise ValueError(f"packed_int8_matmuls: 1 to {MAX_FUSED_WEIGHTS} int8 weights, each with its scales; got "
                         f"{len(weights)} weights and {len(scales)} scales")
    rows = x.shape[0]
    shapes = [jax.ShapeDtypeStruct((rows, weight.shape[0] * PANEL_WIDTH), jnp.float32) for weight in weights]
    num_rows = jnp.asarray(rows if num_rows is None else num_rows, jnp.int32).reshape(())
    return tuple(jax.ffi.ffi_call(TARGET_INT8, shapes)(x.astype(jnp.float32), num_rows, *weights,
                                                        *(scale.astype(jnp.float32) for scale in scales)))


def packed_matmul(x: Float[Array, "rows inner"], panels: Float[Array, "panels inner 16"],
                  out_dtype=jnp.float32, num_rows: Union[int, Int[Array, ""], None] = None,
                  ) -> Float[Array, "rows outer"]:
    """x @ W for one packed weight: packed_matmuls of one."""
    return packed_matmuls(x, (panels,), out_dtype, num_rows)[0]
