"""Block sizes of the TPU grouped matmul, and the VMEM they take.

Decode is bound by reading the touched groups' weights, so the weight block is what is sized: about
RHS_BLOCK_BYTES per DMA (4 MiB streams at full HBM bandwidth and amortizes the ~0.35 us per grid step), as wide
as the output allows, with as much of the contraction as fits (all of it where possible: a group spanning several
row tiles then keeps one weight block and fetches it once per column tile).

TPU blocks are whole (sublane, lane) tiles: a block's last dim is a multiple of 128 or the whole dim, its second-last
a multiple of 8 (16 for bfloat16, 32 for int8) or the whole dim. Two consequences:
  - n not a multiple of 128 (gpt-oss's 2880): the weight block spans all of n. A partial last lane block makes
    XLA:TPU copy the whole weight tensor per call (megablox at [128, 2880, 2880]: 2 GiB of temporaries, see
    docs/tpu-compile.md), which would read every expert at decode.
  - k split into tiles that do not divide it: lhs is zero-padded along k in the wrapper (activations, cheap) and the
    weight block's rows past k (a partial edge block along the sublane dim, which libtpu compiles without a copy)
    are masked in the kernel.
"""

import dataclasses

import jax.numpy as jnp

LANES = 128
RHS_BLOCK_BYTES = 4 * 1024 * 1024
MAX_COLUMN_TILE = 1024
MAX_ROW_TILE = 128
# 16 rows fill a bfloat16 (16, 128) tile and two float32 (8, 128) ones.
MIN_ROW_TILE = 16


@dataclasses.dataclass(frozen=True)
class GroupedMatmulTiles:
    """Block sizes of one grouped matmul."""

    row_tile: int
    """Rows of lhs and of the output per block (tm)."""
    contraction_tile: int
    """Slice of k per block (tk): all of k, or a multiple of 128."""
    column_tile: int
    """Output columns per block (tn): a multiple of 128, or all of n."""


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def choose_row_tile(num_rows: int, num_groups: int) -> int:
    """Rows per tile: about twice the mean group size (decode's few rows per expert waste little MXU work on
    padding rows; prefill's many rows get MXU-sized tiles), a power of two in [MIN_ROW_TILE, MAX_ROW_TILE]."""
    mean_rows = max(1, -(-2 * num_rows // max(num_groups, 1)))
    tile = MIN_ROW_TILE
    while tile < mean_rows and tile < MAX_ROW_TILE:
        tile *= 2
    return min(tile, max(MIN_ROW_TILE, _round_up(num_rows, MIN_ROW_TILE)))


def choose_column_tile(k: int, n: int, rhs_dtype) -> int:
    """Output columns per block: all of n when 128 does not divide it; else the widest multiple of 128 that keeps a
    whole-k weight block within RHS_BLOCK_BYTES (at most MAX_COLUMN_TILE, at least 128), a divisor of n if one is
    at least half that wide, else n split evenly into such tiles (the last one partial: its columns past n are
    never written)."""
    if n % LANES:
        return n
    widest = RHS_BLOCK_BYTES // (k * jnp.dtype(rhs_dtype).itemsize) // LANES * LANES
    widest = min(n, MAX_COLUMN_TILE, max(LANES, widest))
    divisors = [tile for tile in range(widest, widest // 2, -LANES) if n % tile == 0]
    return divisors[0] if divisors else _round_up(-(-n // -(-n // widest)), LANES)


def choose_contraction_tile(k: int, column_tile: int, rhs_dtype) -> int:
    """All of k when its weight block fits RHS_BLOCK_BYTES, else the largest multiple of 128 that fits (a divisor
    of k when one is at least half that size, so no tail is masked)."""
    row_bytes = column_tile * jnp.dtype(rhs_dtype).itemsize
    if k * row_bytes <= RHS_BLOCK_BYTES:
        return k
    largest = max(LANES, RHS_BLOCK_BYTES // row_bytes // LANES * LANES)
    divisors = [tile for tile in range(largest, largest // 2, -LANES) if k % tile == 0]
    return divisors[0] if divisors else largest


def choose_tiles(num_rows: int, k: int, n: int, num_groups: int, rhs_dtype) -> GroupedMatmulTiles:
    """The default blocks for an [num_rows, k] x [num_groups, k, n] grouped matmul."""
    column_tile = choose_column_tile(k, n, rhs_dtype)
    return GroupedMatmulTiles(choose_row_tile(num_rows, num_groups),
                              choose_contraction_tile(k, column_tile, rhs_dtype), column_tile)


def vmem_bytes(tiles: GroupedMatmulTiles, lhs_dtype, rhs_dtype) -> int:
    """VMEM one grid step holds: double-buffered lhs, weight, scale and output blocks, the weight block converted
    to the compute dtype, the float32 accumulator and the dot's result."""
    tm, tk, tn = tiles.row_tile, tiles.contraction_tile, _round_up(tiles.column_tile, LANES)
    lhs_item, rhs_item = jnp.dtype(lhs_dtype).itemsize, jnp.dtype(rhs_dtype).itemsize
    buffers = 2 * (tm * _round_up(tk, LANES) * lhs_item + tk * tn * rhs_item + 8 * tn * 4 + tm * tn * lhs_item)
    converted = tk * tn * lhs_item if rhs_item != lhs_item else 0
    return buffers + converted + 2 * tm * tn * 4
