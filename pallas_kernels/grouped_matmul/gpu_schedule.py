"""The Triton grouped matmul's work list and block sizes: row blocks that start where their group starts.

A GPU load is a gather (any row offsets, masked), so unlike the TPU schedule (tpu_schedule.py: row tiles aligned to
the block, a group straddling a tile edge visited, and its weights read, once per tile it touches) a row block here
begins at its group's first row, or tm rows after the previous block of the same group. A group of s rows is read
ceil(s / tm) times: once at decode (64 tokens x top 8 over 128 experts is ~4 rows each), and an empty group never.
Blocks are listed group after group; the list has a static length (an upper bound) and the blocks past the real
ones are empty (start == end), so their programs exit at once.
"""

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Int32

from pallas_kernels.grouped_matmul.tpu_tiles import GroupedMatmulTiles

MIN_ROW_TILE = 16  # tl.dot's smallest operand side
MAX_ROW_TILE = 64


class RowBlocks(NamedTuple):
    """One entry per row block: the group it multiplies and its rows [row_starts, row_ends)."""

    group_ids: Int32[Array, " blocks"]
    row_starts: Int32[Array, " blocks"]
    row_ends: Int32[Array, " blocks"]
    """Exclusive end of the block's group (the block takes rows up to min(start + tm, end)); == start: no work."""


def max_row_blocks(num_rows: int, num_groups: int, row_tile: int) -> int:
    """An upper bound on sum_i ceil(size_i / tm) over groups whose sizes add up to at most num_rows."""
    return max(1, -(-num_rows // row_tile) + min(num_groups, num_rows))


def row_blocks(group_sizes: Int32[Array, " groups"], num_rows: int, row_tile: int) -> RowBlocks:
    """The row blocks of `group_sizes` over `num_rows` rows (sizes past num_rows are cut there; negatives are 0)."""
    ends = jnp.minimum(jnp.cumsum(jnp.maximum(group_sizes, 0)), num_rows).astype(jnp.int32)
    starts = jnp.concatenate([jnp.zeros(1, jnp.int32), ends[:-1]])
    blocks_per_group = (ends - starts + row_tile - 1) // row_tile
    block_ends = jnp.cumsum(blocks_per_group)
    block = jnp.arange(max_row_blocks(num_rows, group_sizes.shape[0], row_tile), dtype=jnp.int32)
    # compare_all: one fused [blocks, groups] comparison; the default binary search is a loop of small launches.
    group = jnp.searchsorted(block_ends, block, side="right", method="compare_all")
    group = jnp.minimum(group, group_sizes.shape[0] - 1).astype(jnp.int32)
    is_real = block < block_ends[-1]
    first_block_of_group = block_ends[group] - blocks_per_group[group]
    row_starts = starts[group] + (block - first_block_of_group) * row_tile
    return RowBlocks(group, jnp.where(is_real, row_starts, 0).astype(jnp.int32),
                     jnp.where(is_real, ends[group], 0).astype(jnp.int32))


SHARED_MEMORY_BYTES = 227 * 1024
"""What one Triton program may use on an H100 or H200 (228 KiB per SM, 1 KiB kept by the system)."""


def pipeline_shared_bytes(tiles: GroupedMatmulTiles, lhs_dtype, rhs_dtype, num_stages: int) -> int:
    """Shared memory of the k loop's pipeline: num_stages copies of one lhs tile and one weight tile."""
    lhs = tiles.row_tile * tiles.contraction_tile * jnp.dtype(lhs_dtype).itemsize
    rhs = tiles.contraction_tile * tiles.column_tile * jnp.dtype(rhs_dtype).itemsize
    return num_stages * (lhs + rhs)


def _next_power_of_two(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def choose_gpu_tiles(num_rows: int, num_groups: int, lhs_dtype) -> GroupedMatmulTiles:
    """Tiles for an H100 / H200: rows ~ the mean group size (16 at decode, up to 64 at prefill), 128 output columns,
    and k steps of 128 (64 in float32, whose IEEE dots take twice the shared memory per element).

    Per pipeline stage that is at most 64x128 lhs + 128x128 weights in bfloat16 (48 KiB); three stages fit the
    228 KiB of shared memory with room for the accumulator."""
    mean_rows = -(-num_rows // max(1, num_groups))
    row_tile = min(MAX_ROW_TILE, max(MIN_ROW_TILE, _next_power_of_two(mean_rows)))
    contraction_tile = 64 if jnp.dtype(lhs_dtype) == jnp.float32 else 128
    return GroupedMatmulTiles(row_tile=row_tile, contraction_tile=contraction_tile, column_tile=128)
