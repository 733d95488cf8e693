"""The native CPU grouped matmul of a mixture-of-experts layer (grouped_matmul.cc), called inside the jitted step.

The grouped-matmul contract (shared with pallas_kernels/grouped_matmul and models/moe.py): rows of lhs are sorted by
group; rows [start_i, start_i + group_sizes[i]) are multiplied by rhs[i]; rows at or past sum(group_sizes) are padding
and come out zero; an empty group is never read; rhs_scale multiplies output column j of group i by rhs_scale[i, j].
Semantics: jax.lax.ragged_dot(lhs, rhs, group_sizes) (times the scale), which XLA:CPU lowers to a dense dot over every
group, masked: G times the work and every expert's weights read. This kernel reads only the non-empty groups' weights,
each once per call, as stored ([groups, inner, outer], row-major: no packing at load), and sums in float32.
float32, bfloat16 and int8 weights; lhs float32 or bfloat16 (cast to float32 for the kernel, the result cast back).
Without a compiler, grouped_matmul_available() is False and the caller keeps its XLA path.
"""

import functools
import pathlib
from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Float32, Int32, Shaped

from jaxpaged.kernels.cpu_native.native_build import BASE_FLAGS, register

SOURCE = pathlib.Path(__file__).with_name("grouped_matmul.cc")
TARGETS = {
    jnp.dtype(jnp.float32): ("JaxpagedGroupedMatmul", "jaxpaged_grouped_matmul"),
    jnp.dtype(jnp.bfloat16): ("JaxpagedGroupedMatmulBfloat16", "jaxpaged_grouped_matmul_bf16"),
    jnp.dtype(jnp.int8): ("JaxpagedGroupedMatmulInt8", "jaxpaged_grouped_matmul_int8"),
}
"""rhs dtype -> (the library's handler symbol, its XLA custom-call target)."""
# FMA contraction is what the kernel is written for (GCC leaves it off under -std=c++17), as packed_matmul's.
FLAGS = (*BASE_FLAGS, "-ffp-contract=fast")


@functools.cache
def grouped_matmul_available(dtype=jnp.float32) -> bool:
    """Whether the kernel for rhs in `dtype` is built and registered (once per process); False for other dtypes, or
    when it cannot be built (logged once): the caller then runs its XLA path."""
    dtype = jnp.dtype(dtype)
    if dtype not in TARGETS:
        return False
    symbol, target = TARGETS[dtype]
    return register(SOURCE, FLAGS, symbol, target, fallback="the XLA grouped matmul")


def grouped_matmul_cpu(lhs: Float[Array, "m k"], rhs: Shaped[Array, "g k n"], group_sizes: Int32[Array, " g"],
                       rhs_scale: Optional[Float32[Array, "g n"]] = None) -> Float[Array, "m n"]:
    """ragged_dot(lhs, rhs, group_sizes) (times rhs_scale per group and column) in lhs's dtype, float32 sums: the
    contract in the module doc. CPU only; grouped_matmul_available(rhs.dtype) says whether it can run here."""
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.shape != (rhs.shape[0],) or lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"grouped_matmul_cpu: lhs [m, k], rhs [g, k, n] and group_sizes [g], got lhs {lhs.shape}, "
                         f"rhs {rhs.shape}, group_sizes {group_sizes.shape}")
    if rhs_scale is not None and rhs_scale.shape != (rhs.shape[0], rhs.shape[2]):
        raise ValueError(f"grouped_matmul_cpu: rhs_scale must be [g, n] = {(rhs.shape[0], rhs.shape[2])}, "
                         f"got {rhs_scale.shape}")
    dtype = jnp.dtype(rhs.dtype)
    if dtype not in TARGETS:
        raise ValueError(f"grouped_matmul_cpu: rhs dtype {dtype} is none of {[str(d) for d in TARGETS]}")
    if not grouped_matmul_available(dtype):  # registers it on first use; the caller's XLA path runs otherwise
        raise RuntimeError(f"grouped_matmul_cpu: the native kernel for {dtype} could not be built (logged)")
    scales = () if rhs_scale is None else (rhs_scale.astype(jnp.float32),)
    result = jax.ShapeDtypeStruct((lhs.shape[0], rhs.shape[2]), jnp.float32)
    product = jax.ffi.ffi_call(TARGETS[dtype][1], result)(
        lhs.astype(jnp.float32), group_sizes.astype(jnp.int32), rhs, *scales)
    return product.astype(lhs.dtype)
