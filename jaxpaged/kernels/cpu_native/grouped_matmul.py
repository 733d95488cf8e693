"""The native CPU grouped matmul of a mixture-of-experts layer (grouped_matmul.cc), called inside the jitted step.

The grouped-matmul contract (shared with pallas_kernels/grouped_matmul and models/moe.py): rows of lhs are sorted by
group; rows [start_i, start_i + group_sizes[i]) are multiplied by rhs[i]; rows at or past sum(group_sizes) are padding
and come out zero; an empty group is never read; rhs_scale multiplies output column j of group i by rhs_scale[i, j].
Semantics: jax.lax.ragged_dot(lhs, rhs, group_sizes) (times the scale), which XLA:CPU lowers to a dense dot over every
group, masked: G times the work and every expert's weights read. This kernel reads only the non-empty groups' weights,
each once per call, and sums in float32: as stored ([groups, inner, outer], row-major; grouped_matmul_cpu), or
packed once at load into panels [groups, ceil(outer / 128), inner, 128] (pack_expert_panels;
grouped_matmul_cpu_panels), which each work item streams contiguously where the stored layout is walked down strided
column strips: faster where memory bounds the call (decode; benchmarks/kernels/cpu_grouped_matmul.py). Groups of up
to 4 rows on weights as stored stream through the weight's rows in order instead (grouped_stream.h). Two weights of
the same rows (a mixture of experts' gate and up) can share one call (grouped_matmuls_cpu): one hand-out of work to
the threads instead of two. float32, bfloat16 and int8 weights; lhs float32 or bfloat16 (cast to float32 for the
kernel, the result cast back).
Without a compiler, grouped_matmul_available() is False and the caller keeps its XLA path.
"""

import functools
import pathlib
from collections.abc import Sequence
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Float32, Int32, Shaped

from jaxpaged.kernels.cpu_native.native_build import BASE_FLAGS, register

SOURCE = pathlib.Path(__file__).with_name("grouped_matmul.cc")
TARGETS = {
    jnp.dtype(jnp.float32): ("JaxpagedGroupedMatmul", "jaxpaged_grouped_matmul"),
    jnp.dtype(jnp.bfloat16): ("JaxpagedGroupedMatmulBfloat16", "jaxpaged_grouped_matmul_bf16"),
    jnp.dtype(jnp.int8): ("JaxpagedGroupedMatmulInt8", "jaxpaged_grouped_matmul_int8"),
}
"""rhs dtype -> (the library's handler symbol, its XLA custom-call target)."""
MAX_WEIGHTS = 2
"""Weights one call takes (the kernel's kMaxWeights)."""
PANEL_COLUMNS = 128
"""Columns per panel of pack_expert_panels (the kernel's kRunColumns: one work item per panel)."""
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
    contract in the module doc, on weights as stored. CPU only; grouped_matmul_available(rhs.dtype) says whether it
    can run here."""
    if lhs.ndim != 2 or rhs.ndim != 3 or group_sizes.shape != (rhs.shape[0],) or lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"grouped_matmul_cpu: lhs [m, k], rhs [g, k, n] and group_sizes [g], got lhs {lhs.shape}, "
                         f"rhs {rhs.shape}, group_sizes {group_sizes.shape}")
    return _call_kernel(lhs, (rhs,), group_sizes, (rhs_scale,), (rhs.shape[2],))[0]


def grouped_matmuls_cpu(lhs: Float[Array, "m k"], rhs: Sequence[Shaped[Array, "g k _n"]],
                        group_sizes: Int32[Array, " g"],
                        rhs_scales: Optional[Sequence[Optional[Float32[Array, "g _n"]]]] = None,
                        ) -> tuple[Float[Array, "m _n"], ...]:
    """grouped_matmul_cpu of the same lhs by one or two weights in one call (a MoE's gate and up), one result each;
    the weights share a dtype, and either all have scales or none has."""
    if not 1 <= len(rhs) <= MAX_WEIGHTS:
        raise ValueError(f"grouped_matmuls_cpu: 1 to {MAX_WEIGHTS} weights, got {len(rhs)}")
    for weight in rhs:
        if (lhs.ndim != 2 or weight.ndim != 3 or group_sizes.shape != (weight.shape[0],)
                or lhs.shape[1] != weight.shape[1]):
            raise ValueError(f"grouped_matmuls_cpu: lhs [m, k], each rhs [g, k, n] and group_sizes [g], got lhs "
                             f"{lhs.shape}, rhs {weight.shape}, group_sizes {group_sizes.shape}")
    scales = tuple(rhs_scales) if rhs_scales is not None else (None,) * len(rhs)
    return _call_kernel(lhs, tuple(rhs), group_sizes, scales, tuple(weight.shape[2] for weight in rhs))


def grouped_matmul_cpu_panels(lhs: Float[Array, "m k"], panels: Shaped[Array, "g p k 128"],
                              group_sizes: Int32[Array, " g"], rhs_scale: Optional[Float32[Array, "g n"]] = None,
                              *, outer: int) -> Float[Array, "m n"]:
    """grouped_matmul_cpu on weights packed by pack_expert_panels (`outer`: the unpacked n): each work item then reads
    one contiguous panel instead of a strided column strip."""
    num_panels = -(-outer // PANEL_COLUMNS)
    if (lhs.ndim != 2 or panels.ndim != 4 or panels.shape[1] != num_panels or panels.shape[3] != PANEL_COLUMNS
            or lhs.shape[1] != panels.shape[2] or group_sizes.shape != (panels.shape[0],)):
        raise ValueError(f"grouped_matmul_cpu_panels: lhs [m, k], panels [g, ceil(outer / {PANEL_COLUMNS}), k, "
                         f"{PANEL_COLUMNS}] and group_sizes [g], got lhs {lhs.shape}, panels {panels.shape} "
                         f"(outer {outer}), group_sizes {group_sizes.shape}")
    return _call_kernel(lhs, (panels,), group_sizes, (rhs_scale,), (outer,))[0]


def pack_expert_panels(weights: Shaped[np.ndarray, "g k n"]) -> Shaped[np.ndarray, "g p k 128"]:
    """[g, k, n] -> [g, ceil(n / 128), k, 128] in the weights' dtype, the last panel zero-padded: panel p of group i
    holds columns 128p .. 128p + 127 of rhs[i], one contiguous 128-column row per inner index. One host copy, once
    per weight, at load."""
    groups, inner, outer = weights.shape
    num_panels = -(-outer // PANEL_COLUMNS)
    padded = np.zeros((groups, inner, num_panels * PANEL_COLUMNS), weights.dtype)
    padded[:, :, :outer] = weights
    return np.ascontiguousarray(padded.reshape(groups, inner, num_panels, PANEL_COLUMNS).transpose(0, 2, 1, 3))


def unpack_expert_panels(panels: Shaped[np.ndarray, "g p k 128"], outer: int) -> Shaped[np.ndarray, "g k n"]:
    """The inverse of pack_expert_panels (the tests check packing against it)."""
    groups, num_panels, inner, width = panels.shape
    return np.ascontiguousarray(panels.transpose(0, 2, 1, 3).reshape(groups, inner, num_panels * width)[..., :outer])


def _call_kernel(lhs, weights: tuple, group_sizes, scales: tuple, outers: tuple[int, ...]) -> tuple:
    """The custom call on weights in either layout (the kernel tells them apart by rank), one result per weight."""
    if len(scales) != len(weights) or (any(s is None for s in scales) and any(s is not None for s in scales)):
        raise ValueError("grouped_matmul_cpu: either every weight has its rhs_scale or none has")
    dtypes = {jnp.dtype(weight.dtype) for weight in weights}
    for weight, scale, outer in zip(weights, scales, outers):
        if scale is not None and scale.shape != (weight.shape[0], outer):
            raise ValueError(f"grouped_matmul_cpu: rhs_scale must be [g, n] = {(weight.shape[0], outer)}, "
                             f"got {scale.shape}")
    if len(dtypes) != 1:
        raise ValueError(f"grouped_matmul_cpu: the weights of one call share a dtype, got {sorted(map(str, dtypes))}")
    dtype = dtypes.pop()
    if dtype not in TARGETS:
        raise ValueError(f"grouped_matmul_cpu: rhs dtype {dtype} is none of {[str(d) for d in TARGETS]}")
    if not grouped_matmul_available(dtype):  # registers it on first use; the caller's XLA path runs otherwise
        raise RuntimeError(f"grouped_matmul_cpu: the native kernel for {dtype} could not be built (logged)")
    scale_operands = tuple(scale.astype(jnp.float32) for scale in scales if scale is not None)
    results = [jax.ShapeDtypeStruct((lhs.shape[0], outer), jnp.float32) for outer in outers]
    products = jax.ffi.ffi_call(TARGETS[dtype][1], results)(
        lhs.astype(jnp.float32), group_sizes.astype(jnp.int32), *weights, *scale_operands)
    return tuple(product.astype(lhs.dtype) for product in products)
