"""w8a8 on the CPU's int8 dot instruction (vnni_matmul.cc: VPDPBUSD, AVX-512 VNNI or AVX-VNNI), called inside the
jitted step: int8 activation rows with per-row scales times int8 weights packed once at load, with per-column scales.

A weight W [inner, outer] (int8) is packed by pack_vnni into panels [outer / 16, ceil(inner / 4) + 1, 64]: panel p
holds columns 16p .. 16p + 15, its row g the four values W[4g .. 4g + 3, c] of each column c in turn (inner padded
with zeros to a multiple of 4), the order VPDPBUSD reads; its last row holds the columns' corrections 128 * sum_k
W[k, c] as int32 bytes (the kernel shifts x to unsigned by +128 and takes them back off). Built only where this CPU
has the instruction: elsewhere vnni_available() is False and w8a8 stays on XLA's int8 dot.

vnni_matmuls takes rows already quantized to int8; vnni_quantizing_matmuls (AVX-512 VNNI builds) takes float32 or
bfloat16 rows and quantizes them in the kernel, as w8a8 (int8_activations.quantize_rows) or as weight-only int8's two
int8 digits (int16_activations.split_rows), with the same values and scales as XLA computes them.
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

SOURCE = pathlib.Path(__file__).with_name("vnni_matmul.cc")
TARGET = "jaxpaged_vnni_matmul"
QUANTIZING_TARGETS = {("w8a8", "float32"): "jaxpaged_vnni_w8a8_f32", ("w8a8", "bfloat16"): "jaxpaged_vnni_w8a8_bf16",
                      ("digits", "float32"): "jaxpaged_vnni_digits_f32",
                      ("digits", "bfloat16"): "jaxpaged_vnni_digits_bf16"}
"""The calls that quantize float rows themselves (AVX-512 VNNI builds), by what they quantize them to (int8 values,
or two int8 digits of 16-bit values) and x's dtype (their results' too)."""
QUANTIZING_SYMBOLS = {("w8a8", "float32"): "JaxpagedVnniW8A8F32", ("w8a8", "bfloat16"): "JaxpagedVnniW8A8Bf16",
                      ("digits", "float32"): "JaxpagedVnniDigitsF32", ("digits", "bfloat16"): "JaxpagedVnniDigitsBf16"}
PANEL_WIDTH = 16
"""Columns per panel; a weight packs only when its outer size is a multiple of it."""
GROUP = 4
"""Inner values per column that one VPDPBUSD lane sums."""
MAX_INNER = (2**31 - 1) // (255 * 128)
"""The widest inner size whose sums of (x + 128) * W stay exact in int32 (65,793)."""
MAX_FUSED_WEIGHTS = 4
"""Weights one call takes at most (the kernel's kMaxWeights)."""
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")
"""/proc/cpuinfo flags of the CPUs whose VPDPBUSD the kernel uses."""


@functools.cache
def vnni_available() -> bool:
    """Whether this CPU has VPDPBUSD (AVX-512 VNNI with AVX-512, or AVX-VNNI) and the kernel is built and registered
    (once per process); False elsewhere, and when it cannot be built (logged once)."""
    flags = cpu_identity().split()
    if not any(flag in flags for flag in VNNI_FLAGS):
        return False
    return register(SOURCE, BASE_FLAGS, "JaxpagedVnniMatmul", TARGET, fallback="XLA's int8 x int8 dot for w8a8")


@functools.cache
def quantizing_vnni_available() -> bool:
    """Whether the VNNI matmul can quantize float32 / bfloat16 rows itself (vnni_quantizing_matmuls): built with
    AVX-512 VNNI (an AVX-VNNI-only CPU quantizes in XLA, int8_activations / int16_activations, and calls
    vnni_matmuls)."""
    if not vnni_available():
        return False
    return all(register(SOURCE, BASE_FLAGS, QUANTIZING_SYMBOLS[key], target, fallback="quantizing the rows in XLA")
               for key, target in QUANTIZING_TARGETS.items())


def packs_for_vnni(shape: tuple[int, ...]) -> bool:
    """Whether a [inner, outer] weight of this shape packs: outer a positive whole number of panels."""
    return len(shape) == 2 and shape[0] > 0 and shape[1] > 0 and shape[1] % PANEL_WIDTH == 0


def vnni_packed_shape(inner: int, outer: int) -> tuple[int, int, int]:
    """The packed panels' shape of a [inner, outer] weight."""
    return outer // PANEL_WIDTH, -(-inner // GROUP) + 1, PANEL_WIDTH * GROUP


def pack_vnni(values: Int8[np.ndarray, "inner outer"]) -> Int8[np.ndarray, "panels groups_1 64"]:
    """int8 W [inner, outer] -> panels [outer / 16, ceil(inner / 4) + 1, 64] (see the module doc): one host copy,
    once per weight, the column sums taken in int64 from the weight itself."""
    inner, outer = values.shape
    if values.dtype != np.int8 or not packs_for_vnni(values.shape) or inner > MAX_INNER:
        raise ValueError(f"pack_vnni: int8 weight [inner, outer] with outer a positive multiple of {PANEL_WIDTH} and "
                         f"inner at most {MAX_INNER} (int32 sums), got {values.dtype} {values.shape}")
    num_panels, groups_1, _ = vnni_packed_shape(inner, outer)
    padded = np.zeros((GROUP * (groups_1 - 1), outer), np.int8)
    padded[:inner] = values
    # [groups, 4, panels, 16] -> [panels, groups, 16, 4]: each panel row holds 16 columns' four values.
    grouped = padded.reshape(groups_1 - 1, GROUP, num_panels, PANEL_WIDTH).transpose(2, 0, 3, 1)
    corrections = (128 * values.sum(axis=0, dtype=np.int64)).astype("<i4")
    correction_rows = corrections.view(np.int8).reshape(num_panels, 1, PANEL_WIDTH * GROUP)
    return np.concatenate([grouped.reshape(num_panels, groups_1 - 1, PANEL_WIDTH * GROUP), correction_rows], axis=1)


def unpack_vnni(panels: Int8[np.ndarray, "panels groups_1 64"], inner: int) -> Int8[np.ndarray, "inner outer"]:
    """The int8 weight that pack_vnni packed (the tests check packing against it)."""
    num_panels, groups_1, _ = panels.shape
    grouped = panels[:, :-1].reshape(num_panels, groups_1 - 1, PANEL_WIDTH, GROUP).transpose(1, 3, 0, 2)
    return np.ascontiguousarray(grouped.reshape(GROUP * (groups_1 - 1), num_panels * PANEL_WIDTH)[:inner])


def vnni_matmuls(x: Int8[Array, "rows inner"], row_scale: Float32[Array, "rows 1"],
                 weights: Sequence[Int8[Array, "_panels _groups_1 64"]], scales: Sequence[Float32[Array, " _outer"]],
                 num_rows: Union[int, Int[Array, ""], None] = None) -> tuple[Float32[Array, "rows _outer"], ...]:
    """float32(x @ W) * row_scale * scale for each packed W of `weights` (pack_vnni) and its per-column `scales`, in
    one call (the products share the threads and x's rows): int32 sums, exact. `num_rows` (traced or not; default
    every row): rows from it on are padding, left zeros. CPU only: call vnni_available() first."""
    if not 1 <= len(weights) <= MAX_FUSED_WEIGHTS or len(scales) != len(weights):
        raise ValueError(f"vnni_matmuls: 1 to {MAX_FUSED_WEIGHTS} packed weights, each with its scales; got "
                         f"{len(weights)} weights and {len(scales)} scales")
    rows = x.shape[0]
    shapes = [jax.ShapeDtypeStruct((rows, weight.shape[0] * PANEL_WIDTH), jnp.float32) for weight in weights]
    num_rows = jnp.asarray(rows if num_rows is None else num_rows, jnp.int32).reshape(())
    return tuple(jax.ffi.ffi_call(TARGET, shapes)(x.astype(jnp.int8), row_scale.astype(jnp.float32).reshape(rows),
                                                  num_rows, *weights, *(s.astype(jnp.float32) for s in scales)))


def vnni_quantizing_matmuls(x: Float[Array, "rows inner"], weights: Sequence[Int8[Array, "_panels _groups_1 64"]],
                            scales: Sequence[Float32[Array, " _outer"]], digits: bool = False,
                            num_rows: Union[int, Int[Array, ""], None] = None,
                            ) -> tuple[Float[Array, "rows _outer"], ...]:
    """x @ each packed W in one call, x's rows quantized in the kernel as the jnp code does it (the same values and
    scales): w8a8 (digits False), int8_activations.quantize_rows, float32(sum) * row scale * column scale; weight-only
    int8 (digits True), int16_activations.split_rows's two int8 digits, (256 * float32(sum_high) + float32(sum_low)) *
    row scale * column scale. Results rounded to x's dtype (float32 or bfloat16; another dtype is taken as float32).
    `num_rows` as in vnni_matmuls. CPU only: call quantizing_vnni_available() first."""
    if not 1 <= len(weights) <= MAX_FUSED_WEIGHTS or len(scales) != len(weights):
        raise ValueError(f"vnni_quantizing_matmuls: 1 to {MAX_FUSED_WEIGHTS} packed weights, each with its scales; "
                         f"got {len(weights)} weights and {len(scales)} scales")
    if x.dtype not in (jnp.float32, jnp.bfloat16):
        x = x.astype(jnp.float32)
    rows = x.shape[0]
    shapes = [jax.ShapeDtypeStruct((rows, weight.shape[0] * PANEL_WIDTH), x.dtype) for weight in weights]
    num_rows = jnp.asarray(rows if num_rows is None else num_rows, jnp.int32).reshape(())
    target = QUANTIZING_TARGETS["digits" if digits else "w8a8", jnp.dtype(x.dtype).name]
    return tuple(jax.ffi.ffi_call(target, shapes)(x, num_rows, *weights, *(s.astype(jnp.float32) for s in scales)))
