"""Expert weights laid out for the TPU kernel: n padded to whole 128-lane columns, once, when they are loaded.

XLA:TPU gives a [groups, k, n] parameter whose n is not a multiple of 128 (gpt-oss's 2880) a permuted HBM layout
(the groups minor, which pads nothing) and then relayouts the whole tensor for every Mosaic call that reads it: every
expert read per step, decode's bound broken (docs/tpu-compile.md, "The MoE grouped matmul"). Zero columns up to a
multiple of 128 keep the row-major layout. The caller multiplies with the padded weights and drops the extra output
columns (`out[:, :n]`, activations, cheap). The engine pads its expert stacks on the host before placing them
(jaxpaged/runner/expert_lanes.py, widths from `lane_padded_width`); `pad_columns_to_lanes` pads one device array.
"""

from typing import Optional

import jax
import jax.numpy as jnp

LANES = 128


def lane_padded_width(width: int, shards: int = 1) -> int:
    """`width` rounded up so each of `shards` equal slices is whole 128-lane columns (tensor parallelism splitting
    the padded axis gives every device a kernel operand of whole lanes)."""
    step = LANES * shards
    return -(-width // step) * step


def pad_columns_to_lanes(rhs: jax.Array, rhs_scale: Optional[jax.Array] = None
                         ) -> tuple[jax.Array, Optional[jax.Array]]:
    """(rhs [g, k, n'], rhs_scale [g, n'] or None) with n' = n rounded up to 128, the new columns zero."""
    extra = -rhs.shape[-1] % LANES
    if not extra:
        return rhs, rhs_scale
    padded_scale = None if rhs_scale is None else jnp.pad(rhs_scale, ((0, 0), (0, extra)))
    return jnp.pad(rhs, ((0, 0), (0, 0), (0, extra))), padded_scale
