"""Grouped matmul through Pallas' Triton lowering (GPU): one program per (column tile, row block).

The row blocks are gpu_schedule.py's: each starts at its group's first row (or tm rows after the group's previous
block), padded to a static count; a program whose block is empty exits at once, so an empty group's weights are
never read and a decode reads each touched group's once (its few rows sit in one block). A program walks k in
`contraction_tile` steps with float32 accumulation and stores only its block's rows, so no two programs write the
same output element and none needs ordering. Rows past sum(group_sizes) are zeroed after the call.

On the GPU memory is linear: rhs is read as a [groups * k, n] matrix (a free reshape), a group's rows offset by
group * k. Triton wants power-of-two tile sides (>= 16 for tl.dot): row, k and n tails are masked loads and stores
(a masked lane is never touched, so its index may point past the array), so any k and n work (gpt-oss's 2880).
Indices are never clamped into bounds: a clamp hides the columns' contiguity from Triton, which then loads element
by element (removing one took the paged-attention kernel from 34 % to 57 % of a copy's bandwidth on an H200);
masks on k and n exist only where that dim has a tail. int8 weights are converted to the lhs dtype in registers and
the group's column scales applied to the accumulator. float32 asks for Precision.HIGHEST (IEEE dots, not TF32).
"""

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jaxtyping import Array, Float, Int8, Int32

from pallas_kernels.grouped_matmul.gpu_schedule import choose_gpu_tiles, max_row_blocks, row_blocks
from pallas_kernels.grouped_matmul.reference import GPU_FLOAT_DTYPES, check_grouped_matmul_args
from pallas_kernels.grouped_matmul.tpu_tiles import GroupedMatmulTiles


def _kernel(group_ids_ref, row_starts_ref, row_ends_ref, lhs_ref, rhs_ref, *rest,
            k: int, n: int, tiles: GroupedMatmulTiles, has_scale: bool):
    scale_ref, out_ref = rest if has_scale else (None, *rest)
    tm, tk, tn = tiles.row_tile, tiles.contraction_tile, tiles.column_tile
    column_tile, block = pl.program_id(0), pl.program_id(1)
    row_start, row_end = row_starts_ref[block], row_ends_ref[block]

    @pl.when(row_start < row_end)
    def _multiply_block():
        group = group_ids_ref[block]
        rows = row_start + jnp.arange(tm, dtype=jnp.int32)
        row_is_real = rows < row_end
        columns = column_tile * tn + jnp.arange(tn, dtype=jnp.int32)
        column_is_real = columns < n
        # Masks only where a tail exists (statically): an unmasked tile of contiguous columns is one vector load.
        k_has_tail, n_has_tail = k % tk != 0, n % tn != 0
        precision = jax.lax.Precision.HIGHEST if lhs_ref.dtype == jnp.float32 else None

        def accumulate(k_tile, acc):
            ks = k_tile * tk + jnp.arange(tk, dtype=jnp.int32)
            k_is_real = ks < k
            lhs_mask = row_is_real[:, None] & k_is_real[None, :] if k_has_tail else row_is_real[:, None]
            lhs = plgpu.load(lhs_ref.at[rows[:, None], ks[None, :]], mask=lhs_mask, other=0)
            rhs_at = rhs_ref.at[group * k + ks[:, None], columns[None, :]]
            if k_has_tail or n_has_tail:
                rhs = plgpu.load(rhs_at, mask=k_is_real[:, None] & column_is_real[None, :], other=0)
            else:
                rhs = plgpu.load(rhs_at)
            return acc + jax.lax.dot(lhs, rhs.astype(lhs.dtype), precision=precision,
                                     preferred_element_type=jnp.float32)

        acc = jax.lax.fori_loop(0, pl.cdiv(k, tk), accumulate, jnp.zeros((tm, tn), jnp.float32))
        if scale_ref is not None:
            scale_at = scale_ref.at[group, columns]
            scale = plgpu.load(scale_at, mask=column_is_real, other=0) if n_has_tail else plgpu.load(scale_at)
            acc = acc * scale[None, :]
        plgpu.store(out_ref.at[rows[:, None], columns[None, :]], acc.astype(out_ref.dtype),
                    mask=row_is_real[:, None] & column_is_real[None, :] if n_has_tail else row_is_real[:, None])


def _is_power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


@functools.partial(jax.jit, static_argnames=("tiles", "num_warps", "num_stages", "interpret"))
def grouped_matmul_gpu(
    lhs: Float[Array, "m k"],
    rhs: Float[Array, "groups k n"] | Int8[Array, "groups k n"],
    group_sizes: Int32[Array, " groups"],
    rhs_scale: Optional[Float[Array, "groups n"]] = None,
    *,
    tiles: Optional[GroupedMatmulTiles] = None,
    num_warps: int = 4,
    num_stages: int = 3,
    interpret: bool = False,
) -> Float[Array, "m n"]:
    """The grouped-matmul contract (reference.py) on a GPU, float16 activations too; interpret=True runs the kernel
    as plain jnp on the CPU.

    tiles: power-of-two sides, each at least 16 (tl.dot's operands); None: choose_gpu_tiles.
    """
    check_grouped_matmul_args(lhs, rhs, group_sizes, rhs_scale, GPU_FLOAT_DTYPES)
    (m, k), (num_groups, _, n) = lhs.shape, rhs.shape
    if m == 0:  # no rows, no blocks: nothing to launch
        return jnp.zeros((0, n), lhs.dtype)
    tiles = tiles or choose_gpu_tiles(m, num_groups, lhs.dtype)
    if not all(_is_power_of_two(side) and side >= 16 for side in (tiles.row_tile, tiles.contraction_tile,
                                                                  tiles.column_tile)):
        raise ValueError(f"tiles: every side must be a power of two of at least 16, got {tiles}")
    blocks = row_blocks(group_sizes, m, tiles.row_tile)
    operands = [lhs, rhs.reshape(num_groups * k, n)]
    if rhs_scale is not None:
        operands.append(rhs_scale)
    out = pl.pallas_call(
        functools.partial(_kernel, k=k, n=n, tiles=tiles, has_scale=rhs_scale is not None),
        grid=(-(-n // tiles.column_tile), max_row_blocks(m, num_groups, tiles.row_tile)),
        out_shape=jax.ShapeDtypeStruct((m, n), lhs.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="grouped_matmul_gpu",
    )(*blocks, *operands)
    # Rows past sum(group_sizes) belong to no block and were never written (uninitialised memory): zero them.
    num_real_rows = jnp.minimum(jnp.sum(jnp.maximum(group_sizes, 0)), m)
    return jnp.where((jnp.arange(m) < num_real_rows)[:, None], out, 0).astype(lhs.dtype)
