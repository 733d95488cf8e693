"""The native CPU matmul against pre-packed float32 weights (packed_matmul.cc), called inside the jitted step.

A weight W [inner, outer] is packed once, on the host at load time, into panels [outer / 16, inner, 16]: panel p
holds columns 16p .. 16p + 15, one contiguous 16-float row per inner index, the order the kernel's register tiles
read. XLA:CPU's dot library does that packing on every call instead; at a decode step's 64 rows it cost a fifth of
the step (benchmarks/cpu_matmul.py measures both). Without a compiler, or with JAXPAGED_CPU_MATMUL=xla, weights
stay unpacked and XLA's dot runs.
"""

import functools
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from pallas_kernels.cpu_native.native_build import BASE_FLAGS, register

SOURCE = pathlib.Path(__file__).with_name("packed_matmul.cc")
TARGET = "jaxpaged_packed_matmul"
# FMA contraction is what the kernel is written for (GCC leaves it off under -std=c++17).
FLAGS = (*BASE_FLAGS, "-ffp-contract=fast")
PANEL_WIDTH = 16
"""Columns per panel; a weight packs only when its outer size is a multiple of it."""


@functools.cache
def packed_matmul_available() -> bool:
    """Whether the kernel is built and registered (once per process); False with JAXPAGED_CPU_MATMUL=xla or when
    it cannot be built (logged once)."""
    if os.environ.get("JAXPAGED_CPU_MATMUL", "native") == "xla":
        return False
    return register(SOURCE, FLAGS, "JaxpagedPackedMatmul", TARGET, fallback="XLA's dot on unpacked weights")


def fills_whole_panels(shape: tuple[int, ...]) -> bool:
    """Whether a [inner, outer] weight of this shape can be packed (outer a positive whole number of panels)."""
    return len(shape) == 2 and shape[1] % PANEL_WIDTH == 0 and shape[1] > 0


def pack_panels(weight: Float[np.ndarray, "inner outer"]) -> Float[np.ndarray, "panels inner 16"]:
    """W [inner, outer] -> panels [outer / 16, inner, 16]: one host copy, once per weight. A weight that is the
    transpose of a row-major array (how checkpoints store [outer, inner] projections, and a tied embedding) is read
    in that array's row order, so a memory-mapped file is read front to back, not one strided column at a time."""
    inner, outer = weight.shape
    if not fills_whole_panels(weight.shape):
        raise ValueError(f"weight of shape {weight.shape}: outer size must be a positive multiple of {PANEL_WIDTH}")
    if not weight.flags.c_contiguous and weight.T.flags.c_contiguous:
        rows = weight.T  # [outer, inner], row-major
        return np.ascontiguousarray(rows.reshape(outer // PANEL_WIDTH, PANEL_WIDTH, inner).transpose(0, 2, 1))
    return np.ascontiguousarray(weight.reshape(inner, outer // PANEL_WIDTH, PANEL_WIDTH).transpose(1, 0, 2))


def unpack_panels(panels: Float[np.ndarray, "panels inner 16"]) -> Float[np.ndarray, "inner outer"]:
    """The inverse of pack_panels (the tests check packing against it)."""
    num_panels, inner, width = panels.shape
    return np.ascontiguousarray(panels.transpose(1, 0, 2).reshape(inner, num_panels * width))


def packed_matmul(x: Float[Array, "rows inner"], panels: Float[Array, "panels inner 16"]) -> Float[Array, "rows outer"]:
    """x @ W in float32 for W packed by pack_panels. CPU only: call packed_matmul_available() first."""
    rows, outer = x.shape[0], panels.shape[0] * PANEL_WIDTH
    call = jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((rows, outer), jnp.float32))
    return call(x.astype(jnp.float32), panels)
