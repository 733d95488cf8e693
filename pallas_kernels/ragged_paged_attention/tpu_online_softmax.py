"""The online-softmax update both TPU kernels (tpu.py: mixed batches, tpu_decode.py: decode) run per KV chunk."""

from typing import Optional

import jax
import jax.numpy as jnp

from pallas_kernels.ragged_paged_attention.metadata import MASK_VALUE


def accumulate_head(q, keys, values, mask, value_is_real, head: int, max_ref, sum_ref, acc_ref, *,
                    sm_scale: float, soft_cap: Optional[float], precision) -> None:
    """Fold one KV chunk of one KV head into its running max, sum and output accumulator (flash attention).

    q: [rows, head_dim]; keys / values: [chunk, head_dim]; mask: [rows, chunk] (True where a row sees a key);
    value_is_real: [chunk, 1], False for slots past the KV length, whose stale VMEM may hold NaNs.
    """
    logits = jax.lax.dot_general(q, keys, (((1,), (1,)), ((), ())), precision=precision,
                                 preferred_element_type=jnp.float32) * sm_scale
    if soft_cap is not None:
        logits = soft_cap * jnp.tanh(logits / soft_cap)
    logits = jnp.where(mask, logits, MASK_VALUE)
    old_max = max_ref[head]
    new_max = jnp.maximum(old_max, jnp.max(logits, axis=1, keepdims=True))
    probs = jnp.where(mask, jnp.exp(logits - new_max[:, :1]), 0.0)
    rescale = jnp.exp(old_max - new_max)
    sum_ref[head] = rescale * sum_ref[head] + jnp.sum(probs, axis=1, keepdims=True)
    max_ref[head] = new_max
    values = jnp.where(value_is_real, values, jnp.zeros_like(values))
    acc_ref[head] = acc_ref[head] * rescale[:, :1] + jax.lax.dot_general(
        probs.astype(values.dtype), values, (((1,), (0,)), ((), ())), precision=precision,
        preferred_element_type=jnp.float32)


def fold_sinks(sinks_ref, head: int, rows_per_q_head: int, max_ref, sum_ref, acc_ref) -> None:
    """Add each row's attention sink (gpt-oss: a logit in the softmax's denominator only) to one KV head's running
    max and sum, after its last chunk. sinks_ref: [num_q_heads] float32 in SMEM; row r of the head's [rows, 128]
    sums belongs to its q head r // rows_per_q_head of the group. A row that saw no KV (padding) gets sum 1 and
    accumulator 0: its output stays zero."""
    old_max = max_ref[head]
    group_size = old_max.shape[0] // rows_per_q_head
    q_head_of_row = jax.lax.broadcasted_iota(jnp.int32, old_max.shape, 0) // rows_per_q_head
    sinks = jnp.full(old_max.shape, sinks_ref[head * group_size], jnp.float32)
    for g in range(1, group_size):  # a handful of selects: the group's scalars, read from SMEM
        sinks = jnp.where(q_head_of_row == g, sinks_ref[head * group_size + g], sinks)
    new_max = jnp.maximum(old_max, sinks)
    rescale = jnp.exp(old_max - new_max)
    sum_ref[head] = rescale * sum_ref[head] + jnp.exp(sinks - new_max)
    max_ref[head] = new_max
    acc_ref[head] = acc_ref[head] * rescale[:, :1]
