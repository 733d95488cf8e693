"""The grouped-matmul contract and its plain jnp reference (the spec every grouped-matmul kernel is tested against).

    grouped_matmul(lhs: Float[m, k], rhs: Float | Int8[g, k, n], group_sizes: Int32[g],
                   rhs_scale: Optional[Float32[g, n]] = None) -> Float[m, n]   (lhs's dtype, float32 accumulation)

Rows of lhs are sorted by group: rows [start_i, start_i + group_sizes[i]) are multiplied by rhs[i], start_i being
the sum of the earlier sizes. Rows at or past sum(group_sizes) are padding and come out zero. An empty group
(size 0) is never read. rhs_scale (weight-only int8: rhs holds int8 values) multiplies output column j of group i
by rhs_scale[i, j]. The semantics are jax.lax.ragged_dot(lhs, rhs, group_sizes), times the scale.

The reference is that: ragged_dot in float32 at full precision. It is a spec, not a fast path: on CPU ragged_dot
lowers to a dense masked dot over every group (g times the work, every group's weights read).
"""

from typing import Optional

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int, Int8, Int32

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
GPU_FLOAT_DTYPES = (*FLOAT_DTYPES, jnp.dtype(jnp.float16))
"""The Triton kernel also takes float16 (a GPU model served with dtype="half"); Mosaic's TPU kernel does not."""


def check_grouped_matmul_args(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array,
                              rhs_scale: Optional[jax.Array], float_dtypes: tuple = FLOAT_DTYPES) -> None:
    """Raise ValueError naming the argument when the inputs break the contract (shapes and dtypes only)."""
    names = [jnp.dtype(dtype).name for dtype in float_dtypes]
    if lhs.ndim != 2 or jnp.dtype(lhs.dtype) not in float_dtypes:
        raise ValueError(f"lhs: expected a {', '.join(names[:-1])} or {names[-1]} [m, k] matrix, got "
                         f"{lhs.dtype}{list(lhs.shape)}")
    if rhs.ndim != 3 or rhs.shape[1] != lhs.shape[1]:
        raise ValueError(f"rhs: expected [groups, k={lhs.shape[1]}, n], got {list(rhs.shape)}")
    if group_sizes.shape != (rhs.shape[0],) or group_sizes.dtype != jnp.int32:
        raise ValueError(f"group_sizes: expected int32[{rhs.shape[0]}], got {group_sizes.dtype}"
                         f"{list(group_sizes.shape)}")
    if rhs.dtype == jnp.int8:
        if rhs_scale is None:
            raise ValueError("rhs_scale: required when rhs holds int8 values")
    elif jnp.dtype(rhs.dtype) not in float_dtypes:
        raise ValueError(f"rhs: expected {', '.join(names)} or int8 values, got {rhs.dtype}")
    if rhs_scale is not None and (rhs_scale.shape != (rhs.shape[0], rhs.shape[2]) or rhs_scale.dtype != jnp.float32):
        raise ValueError(f"rhs_scale: expected float32[{rhs.shape[0]}, {rhs.shape[2]}], got {rhs_scale.dtype}"
                         f"{list(rhs_scale.shape)}")


def row_groups(group_sizes: Int32[Array, " groups"], num_rows: int) -> Int[Array, " m"]:
    """The group each row belongs to (rows past the last group get the last group; they are padding)."""
    ends = jnp.cumsum(group_sizes)
    return jnp.minimum(jnp.searchsorted(ends, jnp.arange(num_rows), side="right"), group_sizes.shape[0] - 1)


def grouped_matmul_reference(
    lhs: Float[Array, "m k"],
    rhs: Float[Array, "groups k n"] | Int8[Array, "groups k n"],
    group_sizes: Int32[Array, " groups"],
    rhs_scale: Optional[Float[Array, "groups n"]] = None,
) -> Float[Array, "m n"]:
    """The contract above, computed by jax.lax.ragged_dot in float32 (HIGHEST precision), in lhs's dtype."""
    check_grouped_matmul_args(lhs, rhs, group_sizes, rhs_scale)
    out = jax.lax.ragged_dot(lhs.astype(jnp.float32), rhs.astype(jnp.float32), group_sizes,
                             precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
    if rhs_scale is not None:
        out = out * rhs_scale[row_groups(group_sizes, lhs.shape[0])]
    return out.astype(lhs.dtype)
