"""Copy-on-write of KV blocks on the device: the first step of a token-granular prefix hit starts the request's
new block as a copy of a partly matching cached block (every layer's K/V), then computes after the matched run.

The copies go in fixed batches of BLOCK_COPY_BATCH (source, destination) pairs, so one executable compiled at
warm-up serves them all; unused rows copy the null block onto itself. A step without copies runs none.
"""

from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jaxtyping import Array, Int

BLOCK_COPY_BATCH = 8
"""Pairs per copy call: a step rarely admits more hits than this; more take another call."""


def copy_blocks(kv_cache: jax.Array, pairs: Int[Array, " batch 2"]) -> jax.Array:
    """kv_cache[:, destination] = kv_cache[:, source] for every (source, destination) row, all layers at once.

    The block axis is axis 1 in every KV layout (axis 0 stacks the layers). All sources are read before any
    destination is written, and no destination is a source of the same batch (the scheduler holds the sources).
    """
    return kv_cache.at[:, pairs[:, 1]].set(kv_cache[:, pairs[:, 0]])


def padded_copy_batches(block_copies: Sequence[tuple[int, int]]) -> Iterator[np.ndarray]:
    """The step's copies as [BLOCK_COPY_BATCH, 2] int32 arrays, padded with null-block rows (0, 0)."""
    for start in range(0, len(block_copies), BLOCK_COPY_BATCH):
        batch = empty_copy_batch()
        chunk = block_copies[start:start + BLOCK_COPY_BATCH]
        batch[:len(chunk)] = chunk
        yield batch


def empty_copy_batch() -> np.ndarray:
    """A batch of only padding rows (warm-up, and the shape followers receive into)."""
    return np.zeros((BLOCK_COPY_BATCH, 2), np.int32)
